"""Freshness end to end on a real broker and Redis: producer -> consumers -> learner (a short
interval) -> snapshot, export, promotion -> the serving scorer following the pointer; every
stage's metric is there and the stages are ordered.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from streamrec.config import StreamrecConfig
from streamrec.snapshots.store import SnapshotStore

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from freshness import measure  # noqa: E402  (bench/ is a folder of scripts)

INTERVAL_S = 2.0


@pytest.mark.parametrize("processes", [True, False], ids=["processes", "threads"])
def test_every_sample_becomes_servable_and_the_stages_are_ordered(
    pipeline_config: Callable[..., StreamrecConfig], tmp_path: Path, processes: bool
) -> None:
    cfg = pipeline_config(
        consumer={"batch_size": 200, "stop_when_idle_s": None},
        learner={
            "interval_s": INTERVAL_S,
            "snapshot_every": 1,
            "promote": "always",
            "stop_when_idle_s": None,
        },
    )
    result = measure(cfg, rate=150.0, seconds=6.0, poll_s=0.2, processes=processes)

    assert result["events"] == 900 and result["layout"] == ("processes" if processes else "threads")
    assert result["samples"] > 0 and result["samples_servable"] == result["samples"]
    assert result["versions_served"] >= 2  # the pointer was followed, not only read at start
    stages = [result[k]["p50"] for k in ("event_to_sample", "event_to_trained", "event_to_servable")]
    assert 0 <= stages[0] <= stages[1] <= stages[2], result
    assert result["event_to_trained"]["p99"] <= result["event_to_servable"]["p99"]
    assert result["trained_to_servable"]["p50"] > 0 and result["sample_to_trained"]["p50"] > 0

    metrics = result["metrics"]
    e2s = metrics["streamrec_consumer_event_to_sample_seconds"]
    e2t = metrics["streamrec_learner_event_to_trained_seconds"]
    assert e2s["count"] == result["samples"] and e2t["count"] == result["samples"]
    assert e2s["mean"] <= e2t["mean"]
    t2s = metrics["streamrec_serving_trained_to_servable_seconds"]
    newest = metrics["streamrec_serving_event_to_servable_seconds"]
    assert t2s["count"] == newest["count"] == result["versions_served"]
    assert t2s["mean"] <= newest["mean"]  # the newest event in a version is older than its snapshot

    # The manifests record the newest event trained, and the last version holds the last sample.
    store = SnapshotStore(cfg.learner.snapshot_dir)
    newest_ms = [m.newest_event_ms or 0 for m in store.manifests()]
    assert all(newest_ms) and newest_ms == sorted(newest_ms)
