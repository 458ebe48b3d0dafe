"""A learner restarted on a snapshot directory whose newest full snapshot is damaged.

Found by the long-run tour: with retention keeping only the newest chain, truncating the full
snapshot it starts from (``v000003/model.safetensors``) left no version that loads, and the
learner started a fresh model at the group's committed offset with one warning: the 240
samples every earlier version had trained were dropped without a word to the operator.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from streamrec.config import StreamrecConfig
from streamrec.errors import InvalidSnapshot
from streamrec.learner.din import DINLearner
from streamrec.learner.runner import LearnerRunner
from streamrec.snapshots.store import SnapshotStore
from tests.integration.learner.test_bad_samples import BATCH, VALID
from tests.integration.learner.test_parts import publish
from tests.support import small_tables


def trained_four_versions(cfg: StreamrecConfig) -> SnapshotStore:
    """v1 full, v2 a delta, v3 full, v4 a delta on it, each after one micro-batch of BATCH."""
    publish(cfg, range(VALID))
    store = SnapshotStore(cfg.learner.snapshot_dir, full_every=2)
    assert LearnerRunner(cfg, DINLearner(cfg.model), snapshots=store).run().samples_trained == VALID
    return store


def truncate(store: SnapshotStore, version: int) -> None:
    path = store.path(version) / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def config(make: Callable[..., StreamrecConfig], keep: int) -> StreamrecConfig:
    return make(
        model={"tables": small_tables(2**10, 2**6, dim=4), "sequence_length": 8},
        learner={"max_batch_samples": BATCH, "snapshot_every": 1, "keep_snapshots": keep,
                 "full_snapshot_every": 2},
    )


def test_a_damaged_full_snapshot_resumes_from_the_newest_version_that_loads(
    pipeline_config: Callable[..., StreamrecConfig], caplog: pytest.LogCaptureFixture
) -> None:
    cfg = config(pipeline_config, keep=0)
    store = trained_four_versions(cfg)
    assert [store.manifest(v).kind for v in store.versions()] == ["full", "delta", "full", "delta"]
    truncate(store, 3)
    with caplog.at_level(logging.WARNING, logger="streamrec"):
        runner = LearnerRunner(cfg, DINLearner(cfg.model), snapshots=SnapshotStore(store.root, full_every=2))
        stats = runner.run()
    assert runner.resumed is not None and runner.resumed.version == 2
    assert stats.samples_trained == VALID  # 2 x BATCH from v000002, the other 2 x BATCH again
    assert "skipping invalid snapshot version=v000003" in caplog.text
    assert "v000004 is a delta on v000003, which is not valid" in caplog.text


def test_no_version_that_loads_is_refused_not_a_fresh_start(
    pipeline_config: Callable[..., StreamrecConfig],
) -> None:
    cfg = config(pipeline_config, keep=1)
    store = trained_four_versions(cfg)
    assert store.versions() == [3, 4]  # v4 and the full snapshot its chain starts from
    truncate(store, 3)
    with pytest.raises(InvalidSnapshot) as raised:
        LearnerRunner(cfg, DINLearner(cfg.model), snapshots=SnapshotStore(store.root, full_every=2))
    message = str(raised.value)
    assert "v000003" in message and "v000004" in message and "\n" not in message
    assert "move" in message and str(store.root) in message
    assert store.versions() == [3, 4]  # nothing written over them
