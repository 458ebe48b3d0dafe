"""Traffic between versions against a running server: a canary's stable share, its promotion,
abort and automatic rollback while requests flow (none failing), and A/B arms in every response
and on /metrics. The plans are made with the real `streamrec snapshot` commands.
"""

from __future__ import annotations

import shutil
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from typer.testing import CliRunner

from streamrec.cli import app as cli
from streamrec.config import ServingConfig
from streamrec.serving import export as export_module
from streamrec.serving.export import export_dir, export_snapshot
from streamrec.serving.http import build_app, no_history
from streamrec.serving.scorer import Scorer
from streamrec.snapshots.store import SnapshotStore
from streamrec.snapshots.traffic import plan_path, read_plan
from tests.support import SERVED_ENGINE, serving, wait_for

POLL_S = 0.1
USERS = [f"u{n}" for n in range(1000)]


@pytest.fixture
def snapshots(root: Path) -> SnapshotStore:
    """Three trained versions with exports, v000001 served."""
    return SnapshotStore(root)


def snapshot(store: SnapshotStore, *args: str) -> Any:
    """The real `streamrec snapshot` command's --json answer."""
    result = CliRunner().invoke(cli, ["snapshot", *args, "--json", "--snapshot-dir", str(store.root)])
    assert result.exit_code == 0, result.output
    return orjson.loads(result.stdout)


def score(client: httpx.Client, url: str, user: str, **extra: object) -> dict[str, object]:
    response = client.post(f"{url}/score", json={"user": user, "items": ["i1:c1", "i2:c2"], **extra})
    assert response.status_code == 200, response.text
    doc: dict[str, object] = response.json()
    return doc


@contextmanager
def steady_traffic(url: str) -> Iterator[list[str]]:
    """Requests from many users on two threads until the block ends; yields the failures."""
    failures: list[str] = []
    stop = threading.Event()

    def run(offset: int) -> None:
        with httpx.Client(timeout=10) as client:
            n = offset
            while not stop.is_set():
                n += 2
                response = client.post(f"{url}/score", json={"user": f"u{n % 500}", "items": ["i1:c1"]})
                if response.status_code != 200:
                    failures.append(f"{response.status_code} {response.text}")

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for thread in threads:
        thread.start()
    try:
        yield failures
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)


def arms_of_users(client: httpx.Client, url: str) -> dict[str, tuple[str, int]]:
    return {u: (str(d["arm"]), int(str(d["version"]))) for u in USERS for d in [score(client, url, u)]}


def test_canary_share_is_stable_then_promoted_and_aborted_without_a_failed_request(
    snapshots: SnapshotStore,
) -> None:
    app = build_app(Scorer(snapshots.root), no_history, ServingConfig(poll_s=POLL_S))
    with serving(app) as url, httpx.Client(timeout=10) as client, steady_traffic(url) as failures:
        assert score(client, url, "u1")["arm"] == "served"
        started = snapshot(snapshots, "canary", "2", "--share", "20%")
        assert started["traffic"]["arms"][0] == {"name": "canary", "version": 2, "share": 20.0}
        plan = read_plan(snapshots.root)
        assert plan is not None
        wait_for(
            lambda: all(score(client, url, u)["arm"] == plan.arm_of(u).name for u in USERS[:50]),
            10,
            "serve following the plan",
        )

        first, again = arms_of_users(client, url), arms_of_users(client, url)
        assert first == again  # a user always sees one version
        assert all(
            first[u] == (plan.arm_of(u).name, 2 if plan.arm_of(u).name == "canary" else 1) for u in USERS
        )
        share = Counter(arm for arm, _ in first.values())["canary"] / len(USERS)
        assert 0.16 < share < 0.24  # 20% +- 3 standard deviations over 1000 users

        listed = snapshot(snapshots, "list")
        assert listed["traffic"]["kind"] == "canary"
        assert [[a["name"] for a in v["arms"]] for v in listed["versions"]] == [["served"], ["canary"], []]

        metrics = client.get(f"{url}/metrics").text
        assert 'streamrec_serving_arm_requests_total{arm="canary",outcome="ok",version="v000002"}' in metrics
        assert 'streamrec_serving_arm_score_sum_total{arm="served",version="v000001"}' in metrics
        assert 'streamrec_serving_arm_request_seconds_count{arm="canary",version="v000002"}' in metrics

        in_canary = [u for u in USERS[:200] if plan.arm_of(u).name == "canary"]
        snapshot(snapshots, "canary", "--promote")
        for _ in range(10):  # the canary's users never go back to v000001 while serve catches up
            assert {score(client, url, u)["version"] for u in in_canary} == {2}
        wait_for(lambda: {score(client, url, u)["version"] for u in USERS[:100]} == {2}, 10, "promotion")
        assert snapshots.current() == 2 and not plan_path(snapshots.root).exists()
        assert [e.action for e in snapshots.history()] == ["promote", "canary", "promote", "end"]

        snapshot(snapshots, "canary", "3", "--share", "50%")
        wait_for(lambda: 3 in {score(client, url, u)["version"] for u in USERS[:100]}, 10, "second canary")
        ended = snapshot(snapshots, "rollback", "--reason", "looks wrong")
        assert ended["current"] == 2 and "canary=v000003" in str(ended["ended"])
        wait_for(lambda: {score(client, url, u)["version"] for u in USERS[:100]} == {2}, 10, "abort")
        assert snapshots.history()[-1].action == "end" and "looks wrong" in snapshots.history()[-1].reason
    assert failures == []


def test_a_canary_behind_the_served_version_is_rolled_back_by_one_instance(snapshots: SnapshotStore) -> None:
    # Margins no canary meets (its p99 must be 0 s), so the real figures end it once counted.
    strict = ServingConfig(
        poll_s=POLL_S, canary_min_requests=30, canary_latency_ratio=0.0, canary_latency_slack_s=0.0
    )
    apps = [build_app(Scorer(snapshots.root), no_history, strict) for _ in range(2)]
    with (
        serving(apps[0]) as one,
        serving(apps[1]) as two,
        steady_traffic(one) as failures_one,
        steady_traffic(two) as failures_two,
    ):
        snapshot(snapshots, "canary", "2", "--share", "30%")
        wait_for(lambda: not plan_path(snapshots.root).exists(), 30, "automatic rollback")
        ends = [e for e in snapshots.history() if e.action == "end"]
        assert len(ends) == 1 and ends[0].version == 1 and snapshots.current() == 1
        assert ends[0].reason.startswith("auto-rollback of canary v000002 by ")
        assert "p99 latency" in ends[0].reason and "canary and" in ends[0].reason
        with httpx.Client(timeout=10) as client:
            wait_for(lambda: {score(client, one, u)["version"] for u in USERS[:100]} == {1}, 10)
            wait_for(lambda: {score(client, two, u)["version"] for u in USERS[:100]} == {1}, 10)
    assert failures_one == [] and failures_two == []


def test_a_canary_that_cannot_load_is_rolled_back(snapshots: SnapshotStore) -> None:
    app = build_app(Scorer(snapshots.root), no_history, ServingConfig(poll_s=POLL_S))
    with serving(app) as url, steady_traffic(url) as failures:
        snapshot(snapshots, "canary", "3", "--share", "10%")
        weights = snapshots.root / "exports" / "v000003" / "model.pdiparams"
        weights.write_bytes(weights.read_bytes()[:-1])  # damaged after the CLI checked it
        wait_for(lambda: not plan_path(snapshots.root).exists(), 30, "automatic rollback")
        reason = snapshots.history()[-1].reason
        assert "cannot load it: cannot load v000003" in reason and "model.pdiparams" in reason
    assert failures == []


def test_ab_arms_and_request_ids_in_responses_and_per_arm_metrics(snapshots: SnapshotStore) -> None:
    app = build_app(Scorer(snapshots.root), no_history, ServingConfig(poll_s=POLL_S))
    with serving(app) as url, httpx.Client(timeout=10) as client:
        started = snapshot(
            snapshots, "ab", "control=current:50%", "treatment=2:30%", "v000003=20%", "--name", "exp-7"
        )
        assert [a["name"] for a in started["traffic"]["arms"]] == ["control", "treatment", "v000003"]
        plan = read_plan(snapshots.root)
        assert plan is not None and plan.salt == "exp-7"
        wait_for(lambda: score(client, url, "u1")["arm"] == plan.arm_of("u1").name, 10, "the A/B plan")
        versions = {"control": 1, "treatment": 2, "v000003": 3}
        seen = arms_of_users(client, url)
        assert all(seen[u] == (plan.arm_of(u).name, versions[plan.arm_of(u).name]) for u in USERS)
        assert {k: round(v / len(USERS), 1) for k, v in Counter(a for a, _ in seen.values()).items()} == {
            "control": 0.5,
            "treatment": 0.3,
            "v000003": 0.2,
        }

        assert score(client, url, "u1", request_id="req-42")["request_id"] == "req-42"
        headed = client.post(
            f"{url}/score", json={"user": "u1", "items": ["i1"]}, headers={"X-Request-Id": "h-1"}
        )
        assert headed.json()["request_id"] == "h-1"
        made = {score(client, url, "u1")["request_id"] for _ in range(3)}
        assert len(made) == 3 and all(len(str(r)) == 32 for r in made)
        bad = client.post(f"{url}/score", json={"user": "u1", "items": ["i1"], "request_id": ""})
        assert bad.status_code == 400 and "request_id" in bad.json()["error"]

        metrics = client.get(f"{url}/metrics").text
        for arm, version in versions.items():
            assert (
                f'streamrec_serving_arm_requests_total{{arm="{arm}",outcome="ok",version="v{version:06d}"}}'
                in metrics
            )
            assert f'streamrec_serving_arm_scores_total{{arm="{arm}",version="v{version:06d}"}}' in metrics
        shown = snapshot(snapshots, "show", "2")
        assert shown["arms"] == [{"name": "treatment", "version": 2, "share": 30.0}]
        snapshot(snapshots, "ab", "--end")
        wait_for(lambda: score(client, url, "u1")["arm"] == "served", 10, "the end of the A/B test")
        assert {score(client, url, u)["version"] for u in USERS[:100]} == {1}


def test_every_arm_reports_its_engine_on_metrics_and_readyz(
    snapshots: SnapshotStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # v000003 exported without the ONNX graph (as before it existed): Paddle runs that arm
    shutil.rmtree(export_dir(snapshots.root, 3))
    monkeypatch.setattr(export_module, "write_onnx", lambda directory, contract, source=None: None)
    export_snapshot(snapshots, 3)
    app = build_app(Scorer(snapshots.root), no_history, ServingConfig(poll_s=POLL_S))
    with serving(app) as url, httpx.Client(timeout=10) as client:
        served = {"served": {"version": 1, "engine": SERVED_ENGINE}}
        assert client.get(f"{url}/readyz").json()["arms"] == served
        snapshot(snapshots, "ab", "control=current:50%", "treatment=3:50%", "--name", "exp-engines")
        wait_for(lambda: len(client.get(f"{url}/readyz").json()["arms"]) == 2, 30, "the A/B plan")
        assert client.get(f"{url}/readyz").json()["arms"] == {
            "control": {"version": 1, "engine": SERVED_ENGINE},
            "treatment": {"version": 3, "engine": "paddle"},
        }
        metrics = client.get(f"{url}/metrics").text
        info = "streamrec_serving_arm_engine_info"
        assert f'{info}{{arm="control",engine="{SERVED_ENGINE}",version="v000001"}} 1.0' in metrics
        assert f'{info}{{arm="treatment",engine="paddle",version="v000003"}} 1.0' in metrics
        assert metrics.count(f"{info}{{") == 2
        snapshot(snapshots, "ab", "--end")
        wait_for(lambda: len(client.get(f"{url}/readyz").json()["arms"]) == 1, 30, "the end of the A/B test")
        metrics = client.get(f"{url}/metrics").text
        assert metrics.count(f"{info}{{") == 1  # the ended arms are gone, not left at their last value
        assert f'{info}{{arm="served",engine="{SERVED_ENGINE}",version="v000001"}} 1.0' in metrics
