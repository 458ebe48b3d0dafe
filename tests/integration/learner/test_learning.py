"""The learner really learns: progressive AUC on real MovieLens ratings, through the pipeline."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from streamrec.datasets import read_events
from streamrec.learner.runner import MicroBatchReport
from streamrec.pipeline import run_pipeline
from tests.support import small_tables

BATCH = 2500


def test_progressive_auc_on_movielens(pipeline_config, movielens_path: Path) -> None:
    events = read_events(movielens_path, limit=40_000)
    cfg = pipeline_config(
        model={"sequence_length": 20},
        learner={"max_batch_samples": BATCH},
    )
    reports: list[MicroBatchReport] = []
    result = run_pipeline(cfg, events, on_report=reports.append)

    assert result.consumer.samples == len(events)  # explicit labels: one sample per rating
    assert sum(r.metrics.samples for r in reports) == len(events)
    # Progressive: each micro-batch is scored before training, so these are out-of-sample.
    after_10k = [r.metrics.auc for r in reports if r.index > 10_000 // BATCH]
    assert len(after_10k) >= 10
    assert np.mean(after_10k) >= 0.55, [round(a, 3) for a in after_10k]


def test_micro_batches_follow_event_time_across_partitions(
    pipeline_config, movielens_path: Path
) -> None:
    """A backlog on 3 partitions is learnt in event-time order, not one partition after another."""
    events = read_events(movielens_path, limit=15_000)
    cfg = pipeline_config(
        model={"tables": small_tables(2**12, dim=4)}, learner={"max_batch_samples": 1500}
    )
    reports: list[MicroBatchReport] = []
    run_pipeline(cfg, events, on_report=reports.append)
    assert len(reports) == 10
    slack = 2 * cfg.kafka.max_skew_ms  # consumer and learner each align within the skew
    for before, after in zip(reports, reports[1:], strict=False):
        assert after.first_ts >= before.last_ts - slack, (before, after)
