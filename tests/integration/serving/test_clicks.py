"""Click-through per arm, end to end on the real broker and Redis: an A/B test served over HTTP,
click events carrying the responses' request ids produced to the events topic, and each arm's
lists, settled lists and clicks on /metrics, counted once however often an event is delivered;
a list settles when clicked or once its attribution window passed (a clock the test moves).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
from typer.testing import CliRunner

from streamrec.cli import app as cli
from streamrec.config import RedisStoreConfig, StreamrecConfig
from streamrec.kafka.clients import make_producer, produce
from streamrec.local.ports import free_port
from streamrec.serving.clicks import start_click_join
from streamrec.serving.http import build_app, no_history
from streamrec.serving.scorer import Scorer
from streamrec.snapshots.store import SnapshotStore
from streamrec.snapshots.traffic import read_plan
from tests.support import serving, wait_for


def snapshot(root: Path, *args: str) -> None:
    """The real `streamrec snapshot` command on ``root``."""
    result = CliRunner().invoke(cli, ["snapshot", *args, "--snapshot-dir", str(root)])
    assert result.exit_code == 0, result.output


def click(request_id: object, **fields: object) -> bytes:
    """A click event on the events topic, carrying a response's request id."""
    event = {
        "event_id": f"e{request_id}",
        "user_id": "u",
        "item_id": "i1",
        "category_id": "c1",
        "action": "click",
        "ts": 1_700_000_000_000,
        "request_id": request_id,
    }
    return orjson.dumps({**event, **fields})


def figures(metrics: str) -> dict[tuple[str, str, str], float]:
    found = re.findall(
        r'streamrec_serving_arm_(lists|settled_lists|clicks)\{arm="([^"]+)",version="([^"]+)"\} (\S+)',
        metrics,
    )
    return {(kind, arm, version): float(value) for kind, arm, version, value in found}


class Clock:
    """The click join's clock, moved by the test: seconds since the epoch."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def test_clicks_join_to_the_arm_that_served_the_list(
    root: Path, pipeline_config: Callable[..., StreamrecConfig]
) -> None:
    cfg = pipeline_config(serving={"poll_s": 0.1, "click_join": True}, learner={"snapshot_dir": root})
    snapshot(root, "ab", "a=1:50%", "b=2:50%", "--name", "exp-clicks")
    plan = read_plan(root)
    assert plan is not None
    join, consumer = start_click_join(cfg)
    join.clock = clock = Clock()
    try:
        app = build_app(Scorer(root), no_history, cfg.serving, clicks=join)
        with serving(app) as url, httpx.Client(timeout=10) as client:
            served: list[dict[str, Any]] = []

            def probe() -> bool:
                served.append(client.post(f"{url}/score", json={"user": "u0", "items": ["i1"]}).json())
                return served[-1]["arm"] == plan.arm_of("u0").name

            wait_for(probe, 10, "the A/B plan")
            for n in range(60):
                body = {"user": f"u{n}", "items": ["i1", "i2"], "request_id": f"r{n}"}
                served.append(client.post(f"{url}/score", json=body).json())
            lists = Counter(d["arm"] for d in served)

            producer = make_producer(cfg.kafka)
            clicked = served[-60::3]  # a third of the lists get a click
            events = [click(d["request_id"]) for d in clicked]
            events += events[:5]  # delivered twice: counted once
            first = clicked[0]["request_id"]
            events.append(click(first, item_id="i9", label=0, event_id="x"))  # no click
            events.append(click("never-served"))  # no list
            events.append(click(None))  # no request id
            for event in events:
                produce(producer, cfg.kafka.events_topic, event, key=b"u")
            producer.flush(10)

            clicks = Counter(d["arm"] for d in clicked)
            versions = {"a": "v000001", "b": "v000002"}

            def joined() -> bool:
                seen = figures(client.get(f"{url}/metrics").text)
                return all(seen.get(("clicks", arm, versions[arm])) == clicks[arm] for arm in versions)

            wait_for(joined, 30, "the clicks joined")
            seen = figures(client.get(f"{url}/metrics").text)
            for arm, version in versions.items():  # every list served under the plan, the probes' too
                assert seen[("lists", arm, version)] == lists[arm] - (
                    arm == "a" and served[0]["arm"] == "served"
                )
                assert seen[("clicks", arm, version)] == clicks[arm]
                assert seen[("settled_lists", arm, version)] == clicks[arm]  # one click a list
            clock.now += cfg.serving.click_window_s  # the window passed: every list settled
            seen = figures(client.get(f"{url}/metrics").text)
            assert all(seen[("settled_lists", *k[1:])] == seen[("lists", *k[1:])] for k in seen)
            # The redelivered ones joined, not counted: the counts above are already whole
            # while the last of them may still be on its way through the consumer.
            wait_for(lambda: consumer.joined >= len(clicked) + 5, 30, "the redeliveries joined")
            assert consumer.joined == len(clicked) + 5
    finally:
        consumer.stop()


def test_streamrec_serve_joins_clicks_when_configured(
    root: Path,
    tmp_path: Path,
    pipeline_config: Callable[..., StreamrecConfig],
    store_config: RedisStoreConfig,
    unique_name: str,
) -> None:
    cfg = pipeline_config()
    snapshot(root, "ab", "1=50%", "2=50%")
    port = free_port()
    env = {
        **os.environ,
        "STREAMREC_LEARNER__SNAPSHOT_DIR": str(root),
        "STREAMREC_SERVING__PORT": str(port),
        "STREAMREC_SERVING__CLICK_JOIN": "true",
        "STREAMREC_SERVING__CLICK_GROUP": f"clicks-{unique_name}",
        "STREAMREC_KAFKA__BOOTSTRAP_SERVERS": cfg.kafka.bootstrap_servers,
        "STREAMREC_KAFKA__EVENTS_TOPIC": cfg.kafka.events_topic,
        "STREAMREC_STORE__URL": store_config.url,
        "STREAMREC_STORE__KEY_PREFIX": f"t{unique_name}",
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "streamrec", "serve", "--no-store"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(timeout=10) as client:

            def up() -> bool:
                assert server.poll() is None, "streamrec serve stopped"
                try:
                    return client.get(f"{url}/readyz").status_code == 200
                except httpx.TransportError:
                    return False

            wait_for(up, 60, "streamrec serve")
            doc = client.post(f"{url}/score", json={"user": "u1", "items": ["i1"], "request_id": "q1"}).json()
            assert doc["request_id"] == "q1" and doc["arm"] in ("v000001", "v000002")
            producer = make_producer(cfg.kafka)
            produce(producer, cfg.kafka.events_topic, click("q1"), key=b"u")
            producer.flush(10)
            arm = (doc["arm"], f"v{doc['version']:06d}")
            wait_for(
                lambda: figures(client.get(f"{url}/metrics").text).get(("clicks", *arm)) == 1, 30, "the click"
            )
            assert figures(client.get(f"{url}/metrics").text)[("lists", *arm)] == 1
    finally:
        server.terminate()
        output = server.communicate(timeout=30)[0].decode()
    # uvicorn ends on SIGTERM by raising it again once shut down: -15, or 0
    assert server.returncode in (0, -15) and "Traceback" not in output, output
    assert "click join stopped joined=1" in output  # it left its group at shutdown


def test_a_canary_clicked_less_is_rolled_back_once_its_lists_settled(
    root: Path, pipeline_config: Callable[..., StreamrecConfig]
) -> None:
    store = SnapshotStore(root)
    serving_cfg = {
        "poll_s": 0.1, "click_join": True, "canary_ctr_margin": 0.1, "canary_min_lists": 10,
        "click_window_s": 60,
    }
    cfg = pipeline_config(serving=serving_cfg, learner={"snapshot_dir": root})
    snapshot(root, "canary", "2", "--share", "50%")
    join, consumer = start_click_join(cfg)
    join.clock = clock = Clock()
    try:
        app = build_app(Scorer(root), no_history, cfg.serving, clicks=join)
        with serving(app) as url, httpx.Client(timeout=10) as client:
            served = [
                client.post(
                    f"{url}/score", json={"user": f"u{n}", "items": ["i1"], "request_id": f"r{n}"}
                ).json()
                for n in range(60)
            ]
            lists = Counter(d["arm"] for d in served)
            assert set(lists) == {"canary", "served"} and min(lists.values()) >= 10
            producer = make_producer(cfg.kafka)
            for d in served:  # every list of the served version clicked, none of the canary's
                if d["arm"] == "served":
                    produce(producer, cfg.kafka.events_topic, click(d["request_id"]), key=b"u")
            producer.flush(10)
            arm = ("clicks", "served", "v000001")
            wait_for(
                lambda: figures(client.get(f"{url}/metrics").text).get(arm) == lists["served"],
                30,
                "the clicks joined",
            )
            # Within the window the canary's unclicked lists have not settled: nothing is judged,
            # however many polls of the guard pass (its clock stands still).
            time.sleep(1.0)
            assert read_plan(root) is not None
            assert figures(client.get(f"{url}/metrics").text)[("settled_lists", "canary", "v000002")] == 0
            clock.now += 60
            wait_for(lambda: read_plan(root) is None, 30, "the canary ended")
            reason = store.history()[-1].reason
            assert (
                "click-through 0.0000 below the served version's 1.0000 by more than 0.1 over "
                f"{lists['canary']} canary and {lists['served']} served settled lists" in reason
            ), reason
            wait_for(
                lambda: (
                    client.post(f"{url}/score", json={"user": "u1", "items": ["i1"]}).json()["arm"]
                    == "served"
                ),
                10,
            )
            assert store.current() == 1
    finally:
        consumer.stop()
