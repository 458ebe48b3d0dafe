"""The whole flow in one process: publish -> consumers -> learner, for demos and backtests.

In production the three run as separate processes (``streamrec produce``, ``streamrec
consumers run``, ``streamrec learner run``); here the consumer runs in a thread beside the
learner, both stopping once the stream has been idle for a while.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from streamrec.config import StreamrecConfig
from streamrec.consumers.native_runner import ConsumerStats
from streamrec.consumers.runner_choice import make_runner
from streamrec.events import Event
from streamrec.kafka.topics import ensure_topics
from streamrec.learner.registry import make_learner
from streamrec.learner.runner import LearnerRunner, LearnerStats, MicroBatchReport
from streamrec.producer import publish
from streamrec.serving.gate import Promoter
from streamrec.snapshots.store import SnapshotManifest, SnapshotStore

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PipelineResult:
    """What a pipeline run did."""

    published: int
    consumer: ConsumerStats
    learner: LearnerStats
    snapshots: list[SnapshotManifest]
    served: int | None  # the version promoted to serving at the end, if any


def run_pipeline(
    cfg: StreamrecConfig,
    events: Sequence[Event],
    *,
    on_report: Callable[[MicroBatchReport], None] | None = None,
    on_snapshot: Callable[[SnapshotManifest], None] | None = None,
    stop: threading.Event | None = None,
    runner: str = "native",
) -> PipelineResult:
    """Run the whole pipeline in this process.

    Publish ``events``, then consume (with the consumer ``runner`` named) and learn until
    the stream is idle (or ``stop``).
    """
    stop = stop or threading.Event()
    ensure_topics(cfg.kafka)
    published = publish(events, cfg.kafka, schema=cfg.feature_schema())
    consumer = make_runner(runner, cfg)
    failure: list[BaseException] = []
    consumer_done = threading.Event()

    def consume() -> None:
        try:
            consumer.run(stop)
        except BaseException as exc:  # re-raised in the caller's thread below
            failure.append(exc)
            stop.set()
        finally:
            consumer_done.set()

    thread = threading.Thread(target=consume, name="streamrec-consumer", daemon=True)
    snapshots: list[SnapshotManifest] = []

    store = SnapshotStore(cfg.learner.snapshot_dir, full_every=cfg.learner.full_snapshot_every)
    promoter = Promoter(store, cfg.learner)  # exports each snapshot; promotes through the gate

    def snapshot_written(manifest: SnapshotManifest) -> None:
        snapshots.append(manifest)
        if on_snapshot is not None:
            on_snapshot(manifest)
        promoter.on_snapshot(manifest)

    learner = LearnerRunner(
        cfg, make_learner(cfg.model, cfg.feature_schema()), on_report=on_report, on_snapshot=snapshot_written,
        snapshots=store, on_scored=promoter.on_scored,
    )
    promoter.resume(learner.resumed)
    thread.start()
    try:
        stats = learner.run(stop, upstream_done=consumer_done)
    finally:
        stop.set()
        thread.join()
    if failure:
        raise failure[0]
    return PipelineResult(published, consumer.stats, stats, snapshots, store.current())
