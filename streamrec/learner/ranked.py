"""The learner loop as one of several data-parallel ranks (`streamrec.learner.ranks`).

Each rank reads a static share of the samples topic's partitions (partition ``p`` belongs to
rank ``p % world``: no consumer-group rebalance) and gathers a micro-batch from them for
``interval_s`` as the single learner does, up to ``max_batch_samples`` (the cap is per rank:
a group's micro-batch holds up to ``world`` times as many). Each rank decodes, encodes and
scores only its own records; the ranks all-gather only their valid samples' places
(partition, offset), so each knows the group's micro-batch order (`GroupLayout`) and every
rank shuffles it alike and takes the same number of steps. The learner exchanges the ids
(for admission and eviction) and the counts (id statistics, known items) of each rank's
samples, so those are decided alike everywhere; each rank trains its own samples of every
mini-batch, its loss scaled to the mini-batch's mean, and the gradients are all-reduced: the
weights stay identical. Rank 0's reports and promotion gate judge its own samples (its
partitions' share of the micro-batch); the counts it reports and snapshots are the group's.

One version is one snapshot, written by rank 0 alone, holding every rank's positions (the
ranks all-gather them after each micro-batch). A rank killed stops the group: the others'
next collective fails (gloo reports the closed connection) or overruns ``rank_timeout_s``,
and they leave non-zero. The group resumes from the last snapshot, each rank taking its
partitions' positions from it: with another number of ranks too, as positions are per
partition.

Ranks train each micro-batch whole, at its close: training in parts while it is gathered
(``part_s``, `streamrec.learner.parts`) is a single learner's, since the ranks would have to
agree on every part's end as they do on a micro-batch's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from confluent_kafka import Message

from streamrec.config import StreamrecConfig
from streamrec.errors import ConfigError, SnapshotError
from streamrec.kafka.records import Partition
from streamrec.kafka.source import IdleClock
from streamrec.learner.batch import Batch
from streamrec.learner.intake import Intake, decode
from streamrec.learner.ranks import GroupLayout, RankGroup
from streamrec.learner.reports import StepResult
from streamrec.learner.runner import LearnerRunner
from streamrec.learner.trainer import TableLearner
from streamrec.samples import Sample
from streamrec.snapshots.store import SnapshotManifest, SnapshotStore

logger = logging.getLogger(__name__)


class FollowerStore(SnapshotStore):
    """Rank > 0's view of the snapshot directory: it restores from it, never writes it."""

    def lock(self) -> Any:  # noqa: ANN401 - a SnapshotLock's stand-in
        """Rank 0 holds the directory's lock for the group."""
        return _NoLock()

    def prepare(self, snapshot_bytes: int, export_bytes: int = 0) -> None:
        """Rank 0 checks the directory and clears leftovers."""

    def write(self, tensors: Any, **fields: Any) -> SnapshotManifest:  # noqa: ANN401
        """Never called: only rank 0 writes."""
        raise RuntimeError("only rank 0 writes snapshots")


class _NoLock:
    def release(self) -> None:
        """Nothing held."""


class RankedRunner(LearnerRunner):
    """`LearnerRunner` as rank ``group.rank`` of ``group.world``."""

    def __init__(
        self,
        cfg: StreamrecConfig,
        learner: TableLearner,
        group: RankGroup,
        **kwargs: Any,  # noqa: ANN401 - LearnerRunner's callbacks, for rank 0
    ) -> None:
        """Restore (every rank the same version), join the group's training.

        Raises:
            ConfigError: online EWC is on (its penalty reads each rank's own rows).
            SnapshotError: the ranks found different newest snapshots.
        """
        if group.world > 1 and cfg.model.ewc_lambda != 0:
            raise ConfigError(
                "several learner ranks train without online EWC: set STREAMREC_MODEL__EWC_LAMBDA=0 "
                "or run one learner"
            )
        self.group = group
        if group.rank > 0 and "snapshots" not in kwargs:
            kwargs["snapshots"] = FollowerStore(cfg.learner.snapshot_dir)
        super().__init__(cfg, learner, **kwargs)
        self.learner: TableLearner = learner
        versions = group.gather(np.array([self._snapshotted_version or -1]), "restore")
        if len({int(v[0]) for v in versions}) > 1:
            found = ", ".join(f"rank {r}: {int(v[0])}" for r, v in enumerate(versions))
            raise SnapshotError(
                f"the ranks restored different snapshots ({found}; -1: none): every rank must "
                f"read the same {cfg.learner.snapshot_dir}"
            )
        learner.data_parallel(group.share)
        if cfg.learner.part_s < cfg.learner.interval_s:
            logger.info("ranks train each micro-batch whole at its close: part_s=%s ignored",
                        cfg.learner.part_s)

    def owns(self, partition: Partition) -> bool:
        """Whether this rank reads ``partition``."""
        return partition.partition % self.group.world == self.group.rank

    def run(self, stop: threading.Event | None = None, upstream_done: threading.Event | None = None) -> Any:  # noqa: ANN401 - LearnerStats
        """Loop until any rank is stopped, or every rank has been idle ``stop_when_idle_s``."""
        stop = stop or threading.Event()
        idle = IdleClock(self._cfg.learner.stop_when_idle_s, self._source, upstream_done)
        try:
            self._check_retention()
            self._start_every_partition()
            mine = [p for p in sorted(self.positions) if self.owns(p)]
            self._source.assign(mine)
            logger.info(
                "rank %d of %d reads partitions=%s",
                self.group.rank,
                self.group.world,
                ",".join(str(p) for p in mine),
            )
            with ThreadPoolExecutor(1, thread_name_prefix="streamrec-train") as worker:
                while self._round(stop, idle, worker):
                    pass
            if self.group.rank == 0 and self._unsnapshotted():
                self.snapshot()
        finally:
            self.close()
        return self.stats

    def _round(self, stop: threading.Event, idle: IdleClock, worker: ThreadPoolExecutor) -> bool:
        """Gather, exchange, train on one micro-batch; whether the group goes on."""
        records = self._collect(stop, idle)
        intake = decode(records)  # this rank's own records only
        requests = self.group.rank == 0 and bool(self.snapshots.requests.pending())
        head = [int(stop.is_set()), int(idle.expired()), int(requests), len(records), _newest(intake.samples)]
        with self.group.bounded(f"micro-batch {self.stats.micro_batches + 1}"):
            heads, places = self._exchange(head, records, intake)
            stopping = any(h[0] for h in heads) or all(h[1] for h in heads)
            if sum(int(h[3]) for h in heads) >= self._cfg.learner.min_batch_samples:
                self._train_group(records, intake, places, max(int(h[4]) for h in heads), worker)
                idle.busy()
                if self.stats.micro_batches - self._snapshotted_at >= self._cfg.learner.snapshot_every:
                    self._snapshot_group()
            elif records:
                self._source.unread(records)
            if heads[0][2]:
                self._share_positions()
                if self.group.rank == 0:
                    LearnerRunner._serve_requests(self)
        return not stopping

    def _serve_requests(self) -> None:
        """Served between micro-batches (`_round`), when every rank's positions are known."""

    def _exchange(
        self, head: list[int], records: Sequence[Message], intake: Intake
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Every rank's flags and its valid samples' places (partition, offset): no values."""
        places = np.array(
            [[records[i].partition(), records[i].offset()] for i in intake.kept], np.int64
        ).reshape(-1, 2)
        gathered = self.group.gather(np.concatenate([head, places.ravel()]), "exchange")
        return [g[: len(head)] for g in gathered], [g[len(head) :].reshape(-1, 2) for g in gathered]

    def _train_group(
        self,
        records: Sequence[Message],
        intake: Intake,
        places: list[np.ndarray],
        newest: int,
        worker: ThreadPoolExecutor,
    ) -> None:
        """Train this rank's samples as its share of the group's micro-batch."""
        assignments = self._source.assignments
        self._dead_letter(intake.dead, worker)  # each rank its own records'
        layout = GroupLayout.of(places, self.group.rank)
        batch = Batch.from_samples(intake.samples)
        if layout.total:
            result = self._run_held(worker.submit(group_step, self.learner, batch, layout))
            if self._on_scored is not None and len(batch):
                self._run_held(worker.submit(self._on_scored, batch, result.probs))
        self._advance_positions(records, assignments)
        self._share_positions()
        if not layout.total:
            return
        if len(batch):  # the report: this rank's samples' figures, the group's counts
            report = self._record(batch, result, len(intake.dead))
            self.stats.samples_trained += layout.total - len(batch)
            if self._on_report is not None:
                self._on_report(report)
            self._count_bad(report)
        else:
            self.stats.micro_batches += 1
            self.stats.samples_trained += layout.total
        self.stats.newest_event_ms = max(self.stats.newest_event_ms or newest, newest)

    def _share_positions(self) -> None:
        """Take every rank's positions of its own partitions."""
        own = [(p.partition, offset) for p, offset in self.positions.items() if self.owns(p)]
        gathered = self.group.gather(np.array(own, np.int64).ravel(), "positions")
        topic = self._cfg.kafka.samples_topic
        for array in gathered:
            for partition, offset in array.reshape(-1, 2):
                self.positions[Partition(topic, int(partition))] = int(offset)

    def _snapshot_group(self) -> None:
        """Rank 0 writes the version; the others only note that it is written."""
        if self.group.rank == 0:
            self.snapshot()
        else:
            self._snapshotted_at = self.stats.micro_batches
            self._snapshotted_positions = dict(self.positions)


def group_step(learner: TableLearner, batch: Batch, layout: GroupLayout) -> StepResult:
    """Score this rank's samples, then train them as its share of the group's micro-batch."""
    start = time.monotonic()
    probs = learner.predict_many(batch)
    known = learner.is_known(batch)
    scored = time.monotonic()
    train = learner.learn_share(batch, layout)
    return StepResult(probs, known, train, scored - start, time.monotonic() - scored)


def _newest(samples: Sequence[Sample]) -> int:
    """The newest event time of ``samples``, epoch ms; -1 for none."""
    return max((s.ts for s in samples), default=-1)
