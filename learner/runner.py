"""The learner loop: collect a micro-batch of samples, score it, train on it, snapshot.

Progressive validation: every micro-batch is scored by the model *before* it trains on it, so
the logged AUC/GAUC/logloss are honest out-of-sample figures. Offsets move with the model: the
Kafka positions trained up to are stored in each snapshot (and committed to the group only
after the snapshot is durable); a restarted learner loads the newest snapshot and resumes
from its offsets.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from streamrec.config import StreamrecConfig
from streamrec.faults import fault_point
from streamrec.kafka import make_consumer, position
from streamrec.learner.batch import Batch
from streamrec.learner.din import OPTIMIZER_PREFIX, PARAM_PREFIX, DINLearner
from streamrec.learner.metrics import BatchMetrics
from streamrec.learner.snapshot import Offset, SnapshotManifest, SnapshotStore
from streamrec.samples import Sample
from streamrec.source import RecordSource

logger = logging.getLogger(__name__)

# How often the loop looks for snapshot requests and the stop flag while collecting.
_POLL_S = 0.5
# Keep-alive polls during training: well under any max.poll.interval.ms.
_KEEPALIVE_S = 1.0


@dataclass(frozen=True)
class MicroBatchReport:
    """Progressive-validation figures of one micro-batch (scored before training on it)."""

    index: int
    metrics: BatchMetrics
    first_ts: int  # event-time range of the micro-batch's samples, epoch ms
    last_ts: int
    loss: float
    score_seconds: float
    train_seconds: float


@dataclass
class LearnerState:
    """Counters that go into every snapshot."""

    micro_batches: int = 0
    samples_trained: int = 0
    positions: dict[tuple[str, int], int] = field(default_factory=dict)
    last_metrics: dict[str, float] = field(default_factory=dict)


class LearnerRunner:
    """Runs the micro-batch loop over ``samples_topic``; writes snapshots to ``snapshot_dir``."""

    def __init__(
        self,
        cfg: StreamrecConfig,
        on_report: Callable[[MicroBatchReport], None] | None = None,
        on_snapshot: Callable[[SnapshotManifest], None] | None = None,
    ) -> None:
        self._cfg = cfg
        self._on_report = on_report
        self._on_snapshot = on_snapshot
        self.learner = DINLearner(cfg.model)
        self.snapshots = SnapshotStore(cfg.learner.snapshot_dir)
        self.state = LearnerState()
        self._snapshotted_at = 0  # micro_batches at the last snapshot
        self._carry: list[Message] = []  # records read but not yet trained on
        self._restore()
        self._consumer: Consumer = make_consumer(cfg.kafka, cfg.learner.group_id)
        self._source = RecordSource(self._consumer, cfg.kafka.max_skew_ms)

    def _restore(self) -> None:
        manifest = self.snapshots.latest()
        if manifest is None:
            return
        manifest, tensors = self.snapshots.load(manifest.version)
        self.learner.load_state_arrays({k: v for group in tensors.values() for k, v in group.items()})
        self.state.micro_batches = self._snapshotted_at = manifest.micro_batches
        self.state.samples_trained = manifest.samples_trained
        self.state.positions = {(o.topic, o.partition): o.offset for o in manifest.offsets}
        logger.info(
            "restored snapshot version=%d micro_batches=%d", manifest.version, manifest.micro_batches
        )

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            offset = self.state.positions.get((tp.topic, tp.partition))
            if offset is not None:
                tp.offset = offset
        consumer.assign(partitions)
        self._source.assigned(partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._source.revoked()

    def run(
        self, stop: threading.Event | None = None, upstream_done: threading.Event | None = None
    ) -> LearnerState:
        """Loop until ``stop`` is set or ``idle_exit_s`` passes without samples.

        With ``upstream_done``, idleness counts only once that is set, so a slow producer of
        samples (a consumer still joining its group, say) does not end the run early.
        """
        stop = stop or threading.Event()
        lcfg = self._cfg.learner
        self._consumer.subscribe(
            [self._cfg.kafka.samples_topic], on_assign=self._on_assign, on_revoke=self._on_revoke
        )
        last_sample = time.monotonic()
        try:
            while not stop.is_set():
                records = self._collect(stop)
                if len(records) >= lcfg.min_batch_samples:
                    self._train(records)
                    fault_point("learner.after_train")
                    last_sample = time.monotonic()
                    if self.state.micro_batches - self._snapshotted_at >= lcfg.snapshot_every:
                        self.snapshot()
                elif records:
                    self._carry = records + self._carry  # too few to train on yet
                if not self._source.joined or (upstream_done is not None and not upstream_done.is_set()):
                    last_sample = time.monotonic()
                elif lcfg.idle_exit_s is not None and time.monotonic() - last_sample > lcfg.idle_exit_s:
                    logger.info("no samples for %.1fs, stopping", lcfg.idle_exit_s)
                    break
            if self.state.micro_batches > self._snapshotted_at:
                self.snapshot()  # never leave trained-but-unsnapshotted progress behind
        finally:
            self._consumer.close()
        return self.state

    def _collect(self, stop: threading.Event) -> list[Message]:
        """Gather samples for one interval, until the batch is full or the stream goes idle."""
        lcfg = self._cfg.learner
        records, self._carry = self._carry, []
        deadline = time.monotonic() + lcfg.interval_s
        last_got = time.monotonic()
        while len(records) < lcfg.max_batch_samples and not stop.is_set():
            now = time.monotonic()
            if now >= deadline:
                break
            if not self._source.joined:  # idleness counts from the group join
                last_got = now
            elif lcfg.idle_exit_s is not None and now - last_got >= lcfg.idle_exit_s:
                break
            got = self._source.poll(lcfg.max_batch_samples - len(records), min(_POLL_S, deadline - now))
            if got:
                records.extend(got)
                last_got = time.monotonic()
            self._serve_requests()
        cut = lcfg.max_batch_samples  # the aligner can release a longer run than asked for
        records, self._carry = records[:cut], records[cut:]
        return records

    def _train(self, records: Sequence[Message]) -> None:
        samples = [Sample.from_json(m.value() or b"") for m in records]
        batch = Batch.from_samples(samples, self._cfg.model)
        start = time.monotonic()
        probs = self.learner.predict_many(batch)
        metrics = BatchMetrics.compute(batch.label, probs, batch.user_ids, self.learner.is_known(batch))
        scored = time.monotonic()
        loss = self._train_paused(batch)
        self.learner.update_known(batch)
        trained = time.monotonic()
        self._advance_positions(records)
        self.state.micro_batches += 1
        self.state.samples_trained += len(batch)
        self.state.last_metrics = {k: v for k, v in asdict(metrics).items()}
        times = [s.ts for s in samples]
        report = MicroBatchReport(
            self.state.micro_batches, metrics, min(times), max(times), loss,
            scored - start, trained - scored,
        )
        logger.info(
            "micro_batch index=%d samples=%d auc=%.4f gauc=%.4f known_auc=%.4f novelty_auc=%.4f "
            "logloss=%.4f loss=%.4f score_seconds=%.3f train_seconds=%.3f",
            report.index, metrics.samples, metrics.auc, metrics.gauc, metrics.known_auc,
            metrics.novelty_auc, metrics.logloss, loss, report.score_seconds, report.train_seconds,
        )
        if self._on_report is not None:
            self._on_report(report)

    def _advance_positions(self, trained: Sequence[Message]) -> None:
        """Move each partition's position past what was trained, but never past a record
        still waiting in the carry (event-time order can put a lower offset there)."""
        for msg in trained:
            topic, partition, offset = position(msg)
            key = (topic, partition)
            self.state.positions[key] = max(self.state.positions.get(key, 0), offset + 1)
        for msg in self._carry:
            topic, partition, offset = position(msg)
            if self.state.positions.get((topic, partition), 0) > offset:
                self.state.positions[(topic, partition)] = offset

    def _train_paused(self, batch: Batch) -> float:
        """Train with the partitions paused, polling now and then to stay in the group."""
        assignment = self._source.pause_all()
        last = time.monotonic()

        def keepalive() -> None:
            nonlocal last
            if time.monotonic() - last >= _KEEPALIVE_S:
                self._carry.extend(self._source.poll(1000, 0))  # paused: only what was held
                last = time.monotonic()

        try:
            return self.learner.learn_many(batch, keepalive=keepalive)
        finally:
            self._source.resume_all(assignment)

    def _serve_requests(self) -> None:
        for request_id in self.snapshots.pending_requests():
            self.snapshot(request_id)
            self.snapshots.done(request_id)

    def snapshot(self, request_id: str | None = None) -> SnapshotManifest:
        """Write a snapshot of the model and positions, then commit the positions to Kafka."""
        offsets = tuple(
            Offset(t, p, o) for (t, p), o in sorted(self.state.positions.items())
        )
        manifest = self.snapshots.write(
            _grouped(self.learner.state_arrays()),
            micro_batches=self.state.micro_batches,
            samples_trained=self.state.samples_trained,
            offsets=offsets,
            metrics=self.state.last_metrics,
            config={
                "model": self._cfg.model.model_dump(mode="json"),
                "learner": self._cfg.learner.model_dump(mode="json"),
                "kafka": {"samples_topic": self._cfg.kafka.samples_topic},
            },
            request_id=request_id,
        )
        self._snapshotted_at = self.state.micro_batches
        if offsets:
            try:
                self._consumer.commit(
                    offsets=[TopicPartition(o.topic, o.partition, o.offset) for o in offsets],
                    asynchronous=False,
                )
            except KafkaException as exc:
                # The snapshot is the source of truth for positions; the group's committed
                # offsets only serve lag monitoring and learners started without snapshots.
                logger.warning("offset commit after snapshot failed error=%s", exc)
        logger.info(
            "snapshot version=%d micro_batches=%d samples_trained=%d path=%s",
            manifest.version, manifest.micro_batches, manifest.samples_trained,
            self.snapshots.path(manifest.version),
        )
        if self._on_snapshot is not None:
            self._on_snapshot(manifest)
        return manifest


def _grouped(arrays: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """Split learner state into snapshot files: what serving needs (``model``) apart from
    what only resumed training needs (``optimizer``, ``state``)."""
    groups: dict[str, dict[str, np.ndarray]] = {"model": {}, "optimizer": {}, "state": {}}
    for key, array in arrays.items():
        if key.startswith(PARAM_PREFIX):
            groups["model"][key] = array
        elif key.startswith(OPTIMIZER_PREFIX):
            groups["optimizer"][key] = array
        else:
            groups["state"][key] = array
    return groups
