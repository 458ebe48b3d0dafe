"""``streamrec serve`` in front of a real Redis that stops, hangs and comes back: ``/readyz`` and
``/healthz`` say 503 with the reason while it cannot score from the store, ``/livez`` stays 200,
and readiness comes back with the store.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from streamrec.config import RedisStoreConfig, ServingConfig
from streamrec.featurestore import RedisFeatureStore
from streamrec.local.launch import start_redis
from streamrec.serving.http import build_app, store_history
from streamrec.serving.scorer import Scorer
from tests.integration.conftest import PrivateService
from tests.support import SERVED_ENGINE, serving, trained_snapshots

CACHE_S = 0.5


def wait_for(client: httpx.Client, url: str, status: int, within_s: float) -> httpx.Response:
    deadline = time.monotonic() + within_s
    while True:
        response = client.get(url)
        if response.status_code == status:
            return response
        assert time.monotonic() < deadline, f"{url}: {response.status_code} {response.text}"
        time.sleep(0.05)


def test_readiness_follows_the_feature_store(tmp_path: Path, private_redis: PrivateService) -> None:
    snapshots = trained_snapshots(tmp_path / "snapshots", count=1)
    snapshots.promote(1)
    store = RedisFeatureStore(
        RedisStoreConfig(url=f"redis://{private_redis.address}/0", key_prefix="ready"), length=6
    )
    cfg = ServingConfig(ready_cache_s=CACHE_S, ready_timeout_s=0.5)
    app = build_app(Scorer(tmp_path / "snapshots"), store_history(store), cfg)
    score = {"user": "u1", "items": ["i1:c1"]}
    restarted = None
    with serving(app) as url, httpx.Client(timeout=10) as client:
        try:
            assert client.get(f"{url}/readyz").json() == {
                "status": "ok", "version": 1, "current": 1, "serves_current": True, "engine": SERVED_ENGINE,
                "arms": {"served": {"version": 1, "engine": SERVED_ENGINE}},
            }
            assert client.post(f"{url}/score", json=score).status_code == 200

            private_redis.pause()  # hangs: holds its connections, answers nothing
            started = time.monotonic()
            ready = wait_for(client, f"{url}/readyz", 503, within_s=CACHE_S + 3)
            assert time.monotonic() - started < CACHE_S + 2  # not the client's 5 s socket timeout
            assert "did not answer within 0.5 s" in ready.json()["reasons"][0]
            assert client.get(f"{url}/livez").status_code == 200
            private_redis.resume()
            wait_for(client, f"{url}/readyz", 200, within_s=CACHE_S + 10)

            private_redis.proc.stop()  # down: connections refused
            ready = wait_for(client, f"{url}/readyz", 503, within_s=CACHE_S + 3)
            doc = ready.json()
            assert doc["status"] == "unavailable" and doc["version"] == 1
            assert doc["reasons"][0].startswith("feature store not answering: redis")
            health = client.get(f"{url}/healthz")
            assert health.status_code == 503 and health.json()["reasons"] == doc["reasons"]
            assert client.get(f"{url}/livez").json() == {"status": "ok"}
            assert client.post(f"{url}/score", json=score).status_code == 503

            restarted = start_redis("127.0.0.1", private_redis.port, tmp_path / "redis-again")
            wait_for(client, f"{url}/readyz", 200, within_s=CACHE_S + 10)
            assert client.get(f"{url}/healthz").json() == {
                "status": "ok", "version": 1, "current": 1, "serves_current": True, "engine": SERVED_ENGINE,
                "arms": {"served": {"version": 1, "engine": SERVED_ENGINE}},
            }
            assert client.post(f"{url}/score", json=score).status_code == 200
        finally:
            if restarted is not None:
                restarted.stop()
