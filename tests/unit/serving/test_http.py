"""``streamrec serve`` over real HTTP: score, health, metrics, bad requests, and promotions and
rollbacks under load without one failed request.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import uvicorn

from streamrec.config import ServingConfig
from streamrec.serving.export import export_dir
from streamrec.serving.http import build_app, no_history, parse_request
from streamrec.serving.scorer import Candidate, Scorer
from streamrec.snapshots.store import SnapshotStore
from streamrec.snapshots.traffic import Arm, TrafficPlan, write_plan
from tests.support import SERVED_ENGINE, in_thread, serving, trained_snapshots


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, SnapshotStore, Scorer]]:
    store = trained_snapshots(tmp_path, count=2)
    store.promote(1)
    scorer = Scorer(tmp_path)
    port = free_port()
    config = uvicorn.Config(
        build_app(scorer, no_history, ServingConfig(poll_s=0.02)),
        host="127.0.0.1", port=port, log_level="warning",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    yield url, store, scorer
    server.should_exit = True
    thread.join(10)


def test_score_health_and_metrics(served: tuple[str, SnapshotStore, Scorer]) -> None:
    url, _, scorer = served
    history = [["i1", "c0"], ["i2", "c0"]]
    body = {"user": "u1", "items": ["i0:c0", {"item": "i1", "category": "c1"}, "unknown"], "history": history}
    response = httpx.post(f"{url}/score", json=body)
    assert response.status_code == 200
    doc = response.json()
    assert doc["version"] == 1 and len(doc["scores"]) == 3
    candidates = [Candidate("i0", "c0"), Candidate("i1", "c1"), Candidate("unknown")]
    want = scorer.model.score("u1", [("i1", "c0"), ("i2", "c0")], candidates)
    assert np.allclose(doc["scores"], want, atol=1e-6)
    assert httpx.get(f"{url}/healthz").json() == {
        "status": "ok", "version": 1, "current": 1, "serves_current": True, "engine": SERVED_ENGINE,
        "arms": {"served": {"version": 1, "engine": SERVED_ENGINE}},
    }
    metrics = httpx.get(f"{url}/metrics").text
    assert 'streamrec_serving_requests_total{status="200"} 1.0' in metrics
    assert "streamrec_serving_version 1.0" in metrics
    assert f'streamrec_serving_engine_info{{engine="{SERVED_ENGINE}"}} 1.0' in metrics
    other = "paddle" if SERVED_ENGINE == "onnx" else "onnx"
    assert f'streamrec_serving_engine_info{{engine="{other}"}} 0.0' in metrics


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"{", "not valid JSON"),
        (b"[]", "expected a JSON object"),
        (b'{"items": ["a"]}', "field 'user' is missing"),
        (b'{"user": "u", "items": []}', "'items' must be"),
        (b'{"user": "u", "items": [true]}', "an item is"),
        (b'{"user": "u", "items": ["a"], "history": [["a"]]}', "'history' must be"),
    ],
)
def test_a_bad_request_gets_400_with_the_reason(
    served: tuple[str, SnapshotStore, Scorer], body: bytes, reason: str
) -> None:
    response = httpx.post(f"{served[0]}/score", content=body)
    assert response.status_code == 400
    assert reason in response.json()["error"]


def test_too_many_candidates() -> None:
    with pytest.raises(ValueError, match="at most 2"):
        parse_request(b'{"user": "u", "items": ["a", "b", "c"]}', max_candidates=2)


def test_promotions_and_rollbacks_under_load_fail_no_request(
    served: tuple[str, SnapshotStore, Scorer],
) -> None:
    url, store, _ = served
    statuses: list[int] = []
    versions: set[int] = set()
    stop = threading.Event()
    body = {"user": "u3", "items": [f"i{k}:c{k % 5}" for k in range(100)], "history": [["i1", "c1"]]}

    def load() -> None:
        with httpx.Client() as client:
            while not stop.is_set():
                response = client.post(f"{url}/score", json=body)
                statuses.append(response.status_code)
                if response.status_code == 200:
                    versions.add(response.json()["version"])

    workers = [threading.Thread(target=load) for _ in range(4)]
    for worker in workers:
        worker.start()
    try:
        for _ in range(3):
            started = time.monotonic()
            store.promote(2)
            store.rollback()
            assert time.monotonic() - started < 5
            store.promote(2)
            time.sleep(0.3)  # the server follows the pointer
            store.rollback()
            time.sleep(0.3)
    finally:
        stop.set()
        for worker in workers:
            worker.join(10)
    assert statuses and set(statuses) == {200}, f"{len(statuses)} requests"
    assert versions == {1, 2}
    deadline = time.monotonic() + 20  # it follows the last rollback too (loading takes a while on busy cores)
    while httpx.get(f"{url}/healthz").json()["version"] != 1:
        assert time.monotonic() < deadline, "the server did not follow the last rollback"
        time.sleep(0.05)


def test_healthz_tells_when_the_current_version_fails_to_load_and_failures_are_counted(
    served: tuple[str, SnapshotStore, Scorer],
) -> None:
    url, store, _ = served
    params = export_dir(store.root, 2) / "model.pdiparams"
    params.write_bytes(params.read_bytes()[:100])  # truncated
    with store.serving.locked():
        store.serving.point(2)  # pointed at by hand: promote would refuse it
    deadline = time.monotonic() + 20
    while httpx.get(f"{url}/healthz").json()["current"] != 2:
        assert time.monotonic() < deadline, "the server did not read the pointer"
        time.sleep(0.05)
    time.sleep(0.3)  # more polls, each a failed load
    assert httpx.get(f"{url}/healthz").json() == {
        "status": "ok", "version": 1, "current": 2, "serves_current": False, "engine": SERVED_ENGINE,
        "arms": {"served": {"version": 1, "engine": SERVED_ENGINE}},
    }
    metrics = httpx.get(f"{url}/metrics").text
    line = next(x for x in metrics.splitlines() if x.startswith("streamrec_serving_load_failures_total"))
    assert float(line.split()[-1]) >= 2
    assert httpx.post(f"{url}/score", json={"user": "u1", "items": ["i1"]}).json()["version"] == 1


def test_each_version_loaded_is_observed_for_freshness(served: tuple[str, SnapshotStore, Scorer]) -> None:
    """Each version loaded while it serves; not the one at start, which was servable before the
    server started (found by a tour: each restart of `serve` observed one trained-to-servable
    time as old as the version it started on, ~1,400 s, where the promotions' took 5-10 s).
    """
    url, store, _ = served
    before = httpx.get(f"{url}/metrics").text
    assert "streamrec_serving_trained_to_servable_seconds_count 0.0" in before
    store.promote(2)
    deadline = time.monotonic() + 20
    while "streamrec_serving_trained_to_servable_seconds_count 1.0" not in (
        after := httpx.get(f"{url}/metrics").text
    ):
        assert time.monotonic() < deadline, "version 2's load was not observed"
        time.sleep(0.02)
    assert "streamrec_serving_version 2.0" in after
    # These snapshots predate newest_event_ms: no event figures, not wrong ones.
    assert "streamrec_serving_event_to_servable_seconds_count 0.0" in after
    assert "streamrec_serving_model_event_age_seconds NaN" in after


class SlowClicks:
    """A click join whose figures take a second to read (Redis far away, or many lists to settle)."""

    def served(self, *args: object) -> None:
        pass

    def figures(self, plan: object) -> dict[object, object]:
        time.sleep(1.0)
        return {}


def test_a_slow_scrape_leaves_the_event_loop_free(tmp_path: Path) -> None:
    """The click figures read Redis on a scrape; meanwhile the server answers probes and requests."""
    trained_snapshots(tmp_path, count=2).promote(1)
    write_plan(tmp_path, TrafficPlan("ab", "x", (Arm("a", 1, 5000), Arm("b", 2, 5000))))
    app = build_app(Scorer(tmp_path), no_history, ServingConfig(), clicks=SlowClicks())  # type: ignore[arg-type]
    with serving(app) as url, httpx.Client(timeout=10) as client:
        scrape, _ = in_thread(lambda: httpx.get(f"{url}/metrics", timeout=10).status_code)
        time.sleep(0.2)  # the scrape is reading the figures
        start = time.perf_counter()
        assert client.get(f"{url}/livez").status_code == 200
        body = {"user": "u1", "items": ["i1"], "history": []}
        assert client.post(f"{url}/score", json=body).status_code == 200
        waited = time.perf_counter() - start
        scrape.join(10)
    assert waited < 0.5, f"the probe and the request waited {waited:.2f} s for the scrape"


def test_a_feature_store_outage_answers_503_with_retry_after_and_logs_a_line_now_and_then(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`serve --redis-url redis://127.0.0.1:1/0`: every request logged an ERROR line and its
    503 had no Retry-After, where a shed request's has one.
    """
    from starlette.testclient import TestClient

    store = trained_snapshots(tmp_path, count=1)
    store.promote(1)

    def down(user: str) -> list[tuple[str, str]]:
        raise ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")

    with TestClient(build_app(Scorer(tmp_path), down)) as client, caplog.at_level(logging.ERROR):
        for _ in range(20):
            response = client.post("/score", json={"user": "u1", "items": ["i1"]})
            assert response.status_code == 503 and response.headers["retry-after"] == "1"
            assert "Connection refused" in response.json()["error"]
        metrics = client.get("/metrics").text
    lines = [r.getMessage() for r in caplog.records if "score request failed" in r.getMessage()]
    assert len(lines) == 1 and "Connection refused" in lines[0], lines
    assert 'streamrec_serving_requests_total{status="503"} 20.0' in metrics


def test_the_failure_log_repeats_an_error_once_a_period_with_the_count_and_a_new_one_at_once() -> None:
    from streamrec.serving.failures import FailureLog

    now = [0.0]
    logged: list[str] = []

    class Capture(logging.Logger):
        def error(self, msg: object, *args: object, **kwargs: object) -> None:
            logged.append(str(msg) % args)

    log = FailureLog(Capture("x"), every_s=60, clock=lambda: now[0])
    for t in (0, 1, 2, 61, 62):
        now[0] = t
        log.failed(ConnectionError("down"))
    log.failed(TimeoutError("slow"))
    assert len(logged) == 3 and "2 more failed" in logged[1] and "slow" in logged[2]
    log.failed(TimeoutError())  # an error without text is named by its type, not "error="
    assert "error=TimeoutError " in logged[3]


def test_a_pointer_check_that_keeps_failing_logs_a_line_now_and_then_not_a_traceback_a_poll(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by a tour (read from the code): an error the scorer does not expect while it
    follows the pointer (an engine failing on a well-formed export, say) logged a whole
    traceback at every poll.
    """
    from starlette.testclient import TestClient

    store = trained_snapshots(tmp_path, count=1)
    store.promote(1)
    scorer = Scorer(tmp_path)
    calls = []

    def broken() -> bool:
        calls.append(1)
        raise RuntimeError("the engine failed")

    scorer.refresh = broken  # type: ignore[method-assign]
    app = build_app(scorer, no_history, ServingConfig(poll_s=0.01))
    with caplog.at_level(logging.ERROR), TestClient(app):
        deadline = time.monotonic() + 10
        while len(calls) < 20 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert len(calls) >= 20
    lines = [r for r in caplog.records if "pointer check failed" in r.getMessage()]
    assert len(lines) == 1 and "the engine failed" in lines[0].getMessage(), [r.getMessage() for r in lines]
