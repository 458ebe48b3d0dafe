"""The learner loop: collect a micro-batch of samples, score it, train on it, snapshot.

Progressive validation: every micro-batch is scored by the model *before* it trains on it, so
the logged AUC/GAUC/logloss are honest out-of-sample figures. A micro-batch is trained in parts
while it is gathered (every ``part_s``, `streamrec.learner.parts`): each part scored before it
is trained; the report, EWC's consolidation, the positions and the snapshot once per
micro-batch, at its close. Offsets move with the model: the Kafka positions trained up to are
stored in each snapshot (and committed to the group only after the snapshot is durable); a
restarted learner loads the newest valid snapshot and resumes from its positions (both in
`streamrec.learner.progress`). The snapshot directory is locked for the runner's life: one
learner per directory.

Bad input never stops the loop, and bad training never reaches a snapshot: a sample that
breaks the contract is dead-lettered to ``samples_dlq_topic`` (acknowledged before the
positions pass it); a training step whose loss or gradients are not finite is skipped; after
``max_bad_batches`` micro-batches in a row with skipped steps the learner stops with
`TrainingDiverged`, and a snapshot whose weights are not all finite
is refused (`NonFiniteWeights`).

Control flows one way: the model is any `Learner` and is only
called, never calls back. A step runs on a worker thread while this loop keeps the consumer
alive (partitions held, rebalance callbacks served here), however long the step takes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from typing import TypeVar

import numpy as np
from confluent_kafka import Message

from streamrec.closing import Closing
from streamrec.config import StreamrecConfig
from streamrec.deadletters import DeadLetter, DeadLetterLog
from streamrec.faults import fault_point
from streamrec.kafka.clients import make_consumer
from streamrec.kafka.records import Partition, Position
from streamrec.kafka.source import IdleClock, RecordSource
from streamrec.learner.base import Learner, PartLearner
from streamrec.learner.columns import SampleColumns
from streamrec.learner.drift import FeatureDrift
from streamrec.learner.intake import DeadLetterWriter, decode
from streamrec.learner.outputs import checked_known, checked_result, checked_scores, learner_name, raised_by
from streamrec.learner.parts import MicroBatchParts, part_cap
from streamrec.learner.progress import RunnerProgress
from streamrec.learner.reports import (
    LearnerStats,
    MicroBatchReport,
    StepResult,
    count_bad,
    scored_report,
)
from streamrec.learner.schedule import IntervalClock, PartClock
from streamrec.learner.scored import Scored
from streamrec.learner.snapshotting import export_estimate
from streamrec.snapshots.store import SnapshotManifest, SnapshotStore

logger = logging.getLogger(__name__)

# How often the loop looks for snapshot requests and the stop flag while collecting.
_POLL_S = 0.5
# Keep-alive polls while a step runs: well under any max.poll.interval.ms.
_KEEPALIVE_S = 1.0
# librdkafka fetches a partition resumed after a step only once its broker's wait ends, up
# to fetch.wait.max.ms (500 ms by default: measured 0.45 s after each part on a backlog, and
# 0.05 s at 100 ms). A caught-up learner asks its broker 10 times a second, not twice.
_FETCH_WAIT_MS = 100

_T = TypeVar("_T")


class LearnerRunner(RunnerProgress, Closing):
    """Runs the micro-batch loop over ``samples_topic``; writes snapshots to ``snapshot_dir``."""

    def __init__(
        self,
        cfg: StreamrecConfig,
        learner: Learner,
        on_report: Callable[[MicroBatchReport], None] | None = None,
        on_snapshot: Callable[[SnapshotManifest], None] | None = None,
        snapshots: SnapshotStore | None = None,
        on_scored: Callable[[SampleColumns, np.ndarray], object] | None = None,
        dead_letters: DeadLetterWriter | None = None,
    ) -> None:
        """Train ``learner``; restore it from the newest valid snapshot in ``snapshot_dir``.

        The snapshot directory is locked for the runner's life (until `run` ends or
        `close`), and checked before anything is trained, so a second learner, a
        directory that is a file, read-only or full fails here. ``snapshots`` replaces the
        store made from ``cfg`` (tests inject one with a free-space function);
        ``dead_letters`` the writer to ``cfg.kafka.samples_dlq_topic``. ``on_scored(batch,
        probs)`` sees the first part of each micro-batch (the whole, trained at once) with the
        scores the last snapshot's weights gave it before training on it (the promotion gate
        judges that snapshot by them), on the worker thread.

        Raises:
            SnapshotInUse: another learner holds the snapshot directory.
            SnapshotDirError: the directory cannot take snapshots.
        """
        self._cfg = cfg
        self._schema = cfg.feature_schema()
        self._drift = FeatureDrift(self._schema)  # the features the samples carry against these
        self._on_report = on_report
        self._on_snapshot = on_snapshot
        self._on_scored = on_scored
        self.learner = learner
        self.snapshots = snapshots or SnapshotStore(
            cfg.learner.snapshot_dir, full_every=cfg.learner.full_snapshot_every
        )
        self.stats = LearnerStats()
        # The next offset to train per partition: moves with the model, read at assignment.
        self.positions: dict[Partition, int] = {}
        self._snapshotted_at = 0  # micro_batches at the last snapshot
        self._interval = IntervalClock(cfg.learner.interval_s)
        self._snapshotted_positions: dict[Partition, int] = {}  # positions at the last one
        self._snapshotted_version: int | None = None  # the version written or restored last
        self._bad_in_row = 0  # micro-batches in a row with skipped steps
        # The consumers' limit: it is the broker's record size that bounds both DLQs.
        self._dead_letters = dead_letters or DeadLetterWriter(
            cfg.kafka, cfg.consumer.dead_letter_max_bytes
        )
        self._dead_log = DeadLetterLog(logger, self._dead_letters.topic)
        self._lock = self.snapshots.lock()
        self._closed = False
        try:
            arrays = learner.state_arrays()
            self.snapshots.prepare(
                sum(a.nbytes for a in arrays.values()), export_estimate(self.snapshots.root, arrays)
            )
            self._resume()
            self._source = RecordSource(
                make_consumer(cfg.kafka, cfg.learner.group_id, **{"fetch.wait.max.ms": _FETCH_WAIT_MS}),
                [cfg.kafka.samples_topic],
                cfg.kafka.max_skew_ms,
                max_hold_ms=cfg.kafka.max_hold_ms,
                start_at=self.positions,
            )
        except BaseException:
            self._lock.release()
            raise

    def close(self) -> None:
        """Leave the group and release the snapshot directory; `run` does it on return.

        Safe to call more than once.
        """
        if self._closed:
            return
        self._closed = True
        try:
            self._source.close()
        finally:
            self._lock.release()

    def run(
        self, stop: threading.Event | None = None, upstream_done: threading.Event | None = None
    ) -> LearnerStats:
        """Loop until ``stop`` is set or ``stop_when_idle_s`` passes without samples.

        With ``upstream_done``, idleness counts only once that is set, so a slow producer of
        samples (a consumer still joining its group, say) does not end the run early.
        """
        stop = stop or threading.Event()
        lcfg = self._cfg.learner
        idle = IdleClock(lcfg.stop_when_idle_s, self._source, upstream_done)
        try:
            self._check_positions()
            self._start_every_partition()
            self._source.subscribe()
            with ThreadPoolExecutor(1, thread_name_prefix="streamrec-train") as worker:
                while not stop.is_set():
                    parts = MicroBatchParts()
                    until = (self._interval.next_close(), lcfg.max_batch_samples)
                    records = self._collect(stop, idle, until, (parts, worker))
                    if parts.begun or len(records) >= lcfg.min_batch_samples:
                        self._train(records, worker, parts)
                        idle.busy()  # a long step is not idleness: samples wait held meanwhile
                        fault_point("learner.after_train")
                        if self.stats.micro_batches - self._snapshotted_at >= lcfg.snapshot_every:
                            self.snapshot()
                    elif records:
                        self._source.unread(records)  # too few to train on yet
                    if idle.expired():
                        logger.info("no samples for %.1fs, stopping", lcfg.stop_when_idle_s)
                        break
            if self._unsnapshotted():
                self.snapshot()  # never leave trained-but-unsnapshotted progress behind
        finally:
            self.close()  # the consumer and the snapshot directory's lock
        return self.stats

    def _collect(
        self,
        stop: threading.Event,
        idle: IdleClock,
        until: tuple[float, int],
        parts: tuple[MicroBatchParts, ThreadPoolExecutor] | None = None,
        caught_up: bool = False,
    ) -> list[Message]:
        """Gather samples until ``until`` (a close on the monotonic clock, and a count) or idleness.

        With ``parts`` (kept, and the worker to train them on), ``until`` is the micro-batch's
        and the samples gathered are trained at each part's end (`PartClock`, or
        ``max_part_samples`` gathered) once there are ``min_eval_samples`` of them (fewer
        gather on to the next); the records of the last part are returned. A snapshot request
        closes a micro-batch partly trained (a snapshot holds whole ones): it is served after
        the close. Without, all that was gathered is returned: a whole micro-batch, or one
        part of a rank's (`streamrec.learner.ranked`). ``caught_up``: stop gathering, too,
        once the source is (`RecordSource.caught_up`).

        A rebalance while gathering (partitions revoked, lost to a session timeout, handed to
        another member or back) starts each partition assigned again at the trained
        positions, before what was gathered: a record at or below the highest offset gathered
        from its partition is a second reading and is left out. Records of a partition lost
        meanwhile are trained all the same; the positions pass them before it comes back.
        """
        lcfg = self._cfg.learner
        deadline, room = until
        cap = room if parts is None else part_cap(lcfg)
        records: list[Message] = []
        gathered: dict[Partition, int] = {}  # the highest offset gathered, per partition
        again = 0
        ends = None if parts is None else PartClock(deadline, lcfg.part_s)
        part_end = deadline if ends is None else ends.next_end()
        while len(records) < room and not stop.is_set() and not idle.expired():
            # At least one poll, so a micro-batch closing at once (its step late) takes what
            # waits: the keep-alive polls of the step before read it.
            wait = max(0.0, min(_POLL_S, part_end - time.monotonic()))
            if caught_up and self._source.caught_up():
                wait = 0.0  # nothing to wait for: take what came meanwhile and end
            for msg in self._source.poll(min(room, cap) - len(records), wait):
                pos = Position.of(msg)
                if pos.offset <= gathered.get(pos.key, -1):
                    again += 1
                    continue
                gathered[pos.key] = pos.offset
                records.append(msg)
            if parts is not None and parts[0].begun:
                if self.snapshots.requests.pending():
                    break
            else:
                self._serve_requests()
            now = time.monotonic()
            if now >= deadline or (caught_up and self._source.caught_up()):
                break
            if parts is not None and ends is not None and (now >= part_end or len(records) >= cap):
                if len(records) >= max(lcfg.min_batch_samples, lcfg.min_eval_samples):
                    self._train_part(records, parts[1], parts[0])
                    room -= len(records)
                    records = []
                    idle.busy()
                    fault_point("learner.after_part")
                if now >= part_end:
                    part_end = ends.next_end()
        if again:
            logger.info("rebalanced while gathering: left out records read again count=%d", again)
        # put-back records can make a longer run than asked for
        self._source.unread(records[room:])
        return records[:room]

    def _train(
        self, records: Sequence[Message], worker: ThreadPoolExecutor, parts: MicroBatchParts | None = None
    ) -> None:
        """Train the last part of a micro-batch, then close it.

        The close: EWC's consolidation over every part, the positions past every record, one
        report over every part's scores. A micro-batch of one part is trained whole
        (``learn_many``), as before parts.
        """
        parts = MicroBatchParts() if parts is None else parts
        assignments = self._source.assignments
        if records:
            self._train_part(records, worker, parts, whole=not parts.steps)
        if parts.open:
            self._run_held(worker.submit(self._end_micro_batch))
        self._advance_positions(parts.ends, assignments)
        self._report(parts)

    def _report(self, parts: MicroBatchParts) -> None:
        """The closed micro-batch's one report, over every part's scores; none if it trained none."""
        if not parts.steps:
            return
        scored, result = parts.merged()
        report = self._record(scored, result, parts.dead)
        if len(parts.steps) > 1:
            logger.info("micro_batch index=%d parts=%d last_part_samples=%d",
                        report.index, len(parts.steps), len(parts.scored[-1]))
        if self._on_report is not None:
            self._on_report(report)
        self._count_bad(report)

    def _train_part(
        self,
        records: Sequence[Message],
        worker: ThreadPoolExecutor,
        parts: MicroBatchParts,
        whole: bool = False,
    ) -> None:
        """Dead-letter a part's invalid records, score then train on the rest; keep it in ``parts``.

        The positions wait for the micro-batch's close. The first part with samples is
        scored by the last snapshot's weights: ``on_scored`` judges it. ``whole``: the
        micro-batch's only samples.
        """
        intake = decode(records, self._schema)
        self._dead_letter(intake.dead, worker)  # durable before any position passes them
        step = batch = None
        if intake.samples:
            batch = SampleColumns.from_samples(intake.samples)
            self._drift.observe(batch)
            part = not whole and isinstance(self.learner, PartLearner)
            step = self._run_held(worker.submit(self._step, batch, part))
            parts.open |= part
            if self._on_scored is not None and not parts.steps:
                self._run_held(worker.submit(self._on_scored, batch, step.probs))
        parts.add(records, step, len(intake.dead), batch)

    def _dead_letter(self, letters: Sequence[DeadLetter], worker: ThreadPoolExecutor) -> None:
        """Write dead letters and wait for the broker's acknowledgement.

        Write dead letters and wait for the broker's acknowledgement, on the worker thread
        so the consumer stays served however long the broker takes.
        """
        if not letters:
            return
        self._run_held(worker.submit(self._dead_letters.write, letters))
        self.stats.dead += len(letters)
        self._dead_log.add(letters)

    def _record(self, scored: Scored, result: StepResult, dead: int) -> MicroBatchReport:
        """Count a trained micro-batch in the stats; log and return its report."""
        index = self.stats.micro_batches + 1
        return self._count(scored_report(index, scored, result, dead, self._cfg.learner.min_eval_samples))

    def _count(self, report: MicroBatchReport) -> MicroBatchReport:
        """Count a trained micro-batch's ``report`` in the stats."""
        self.stats.micro_batches += 1
        self.stats.samples_trained += report.metrics.samples
        self.stats.last_metrics = dict(asdict(report.metrics))
        newest = self.stats.newest_event_ms
        self.stats.newest_event_ms = report.last_ts if newest is None else max(newest, report.last_ts)
        return report

    def _count_bad(self, report: MicroBatchReport) -> None:
        """`count_bad` with this runner's stats, count in a row and ``max_bad_batches``."""
        self._bad_in_row = count_bad(self.stats, report, self._bad_in_row, self._cfg.learner.max_bad_batches)

    def _step(self, batch: SampleColumns, part: bool = False) -> StepResult:
        """Score, then train (a ``part`` with `PartLearner.learn_part`): on the worker thread.

        It touches nothing but the learner.
        """
        start = time.monotonic()
        learner, who = self.learner, learner_name(self.learner)
        where = f"learner run, micro-batch {self.stats.micro_batches + 1}"
        with raised_by(who, "predict_many", where):
            probs = learner.predict_many(batch)
        probs = checked_scores(probs, len(batch), who, finite=False)  # NaN: below
        with raised_by(who, "is_known", where):
            known = checked_known(learner.is_known(batch), len(batch), who)
        scored = time.monotonic()
        if part and isinstance(learner, PartLearner):
            with raised_by(who, "learn_part", where):
                train = learner.learn_part(batch)
        else:
            with raised_by(who, "learn_many", where):
                train = learner.learn_many(batch)
        if not checked_result(train, who).bad:  # NaN scores, sound steps: broken, not diverged
            checked_scores(probs, len(batch), who)
        return StepResult(probs, known, train, scored - start, time.monotonic() - scored)

    def _end_micro_batch(self) -> None:
        """Close the micro-batch the parts trained in the learner (EWC consolidates)."""
        if isinstance(self.learner, PartLearner):
            self.learner.end_micro_batch()

    def _run_held(self, step: Future[_T]) -> _T:
        """Wait for work on the worker thread, serving the consumer.

        Wait for work on the worker thread with every partition held, serving the consumer
        meanwhile.
        """
        self._source.hold()
        try:
            while True:
                try:
                    return step.result(timeout=_KEEPALIVE_S)
                except TimeoutError:
                    self._source.keepalive()
        finally:
            self._source.release()
