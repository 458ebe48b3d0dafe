"""A learner whose retention fails trains on: pruning old snapshots is housekeeping.

Found by a tour (read from the code): the learner pruned after each snapshot unguarded, so a
prune that failed (the serving pointer's lock held past its timeout by an operator's command,
a directory it cannot delete) ended the learner, though the snapshot itself was durable.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from confluent_kafka import Producer

from streamrec.config import StreamrecConfig
from streamrec.errors import SnapshotError
from streamrec.learner.din import DINLearner
from streamrec.learner.runner import LearnerRunner
from streamrec.snapshots.store import SnapshotStore
from tests.integration.learner.test_bad_samples import BATCH, VALID, sample
from tests.support import small_tables


class PruneFails(SnapshotStore):
    """A store whose retention always fails, as with the pointer's lock held by another."""

    def prune(self, keep_last: int) -> list[int]:
        raise SnapshotError(f"{self.root}/serving/.lock stayed locked for 60s: another command holds it")


def test_a_failed_prune_is_logged_and_the_learner_trains_on(
    pipeline_config: Callable[..., StreamrecConfig], caplog: pytest.LogCaptureFixture
) -> None:
    cfg = pipeline_config(
        model={"tables": small_tables(2**10, 2**6, dim=4), "sequence_length": 8},
        learner={"max_batch_samples": BATCH, "snapshot_every": 1, "keep_snapshots": 2},
    )
    producer = Producer({"bootstrap.servers": cfg.kafka.bootstrap_servers})
    for n in range(VALID):
        s = sample(n)
        producer.produce(cfg.kafka.samples_topic, key=s.user_id.encode(), value=s.to_json(), timestamp=s.ts)
    assert producer.flush(10) == 0
    store = PruneFails(cfg.learner.snapshot_dir)
    with caplog.at_level(logging.ERROR, logger="streamrec.learner"):
        stats = LearnerRunner(cfg, DINLearner(cfg.model), snapshots=store).run()
    assert stats.samples_trained == VALID
    assert len(store.versions()) >= 3  # every snapshot written, none pruned
    assert "retention failed" in caplog.text and "stayed locked" in caplog.text
