"""Retention over many promotions: a learner that promotes every snapshot keeps a bounded directory.

Found by the long-run tour: under ``promote=always`` with KEEP_SNAPSHOTS=3, 120 micro-batches left
120 versions and 120 exports, since retention kept every version ever promoted.
"""

from __future__ import annotations

from collections.abc import Callable

from streamrec.config import StreamrecConfig
from streamrec.learner.din import DINLearner
from streamrec.learner.runner import LearnerRunner, LearnerStats
from streamrec.serving.gate import Promoter
from streamrec.snapshots.exports import EXPORTS
from streamrec.snapshots.store import SnapshotStore
from tests.integration.learner.test_parts import publish
from tests.support import small_tables

BATCH = 20


def run(cfg: StreamrecConfig) -> tuple[SnapshotStore, LearnerStats]:
    store = SnapshotStore(cfg.learner.snapshot_dir, full_every=cfg.learner.full_snapshot_every)
    promoter = Promoter(store, cfg.learner)
    runner = LearnerRunner(cfg, DINLearner(cfg.model), snapshots=store, on_snapshot=promoter.on_snapshot,
                           on_scored=promoter.on_scored)
    promoter.resume(runner.resumed)
    return store, runner.run()


def exports(store: SnapshotStore) -> list[int]:
    return sorted(int(p.name[1:]) for p in (store.root / EXPORTS).iterdir() if p.name.startswith("v"))


def test_promoting_every_snapshot_keeps_the_directory_bounded_and_a_restart_resumes(
    pipeline_config: Callable[..., StreamrecConfig],
) -> None:
    cfg = pipeline_config(
        model={"tables": small_tables(2**8, 2**5, dim=4), "sequence_length": 8},
        learner={"max_batch_samples": BATCH, "snapshot_every": 1, "keep_snapshots": 2,
                 "full_snapshot_every": 3, "promote": "always"},
    )
    publish(cfg, range(12 * BATCH))
    store, stats = run(cfg)
    assert (stats.micro_batches, store.current()) == (12, 12)
    assert store.promoted() == list(range(1, 13))
    # Pruned as v000012 was written, v000011 served: 9 and 10 a rollback's targets, 7 and 8 the
    # chain 9 loads, 11 and 12 the newest (before, all twelve and their exports stayed); 7 and 8
    # are kept for the chain alone, without their exports: nothing serves them
    assert store.versions() == [7, 8, 9, 10, 11, 12]
    assert exports(store) == [9, 10, 11, 12]
    assert [store.manifest(v).kind for v in (7, 10)] == ["full", "full"]
    publish(cfg, range(12 * BATCH, 15 * BATCH))
    store, stats = run(cfg)
    assert stats.samples_trained == 15 * BATCH  # 12 batches from v000012, 3 more, each once
    assert (stats.micro_batches, store.current()) == (15, 15)
    assert store.versions() == [10, 11, 12, 13, 14, 15]
    assert exports(store) == [12, 13, 14, 15]  # 10 and 11 for 12's chain alone
