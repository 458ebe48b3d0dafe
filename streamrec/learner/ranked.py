"""The learner loop as one of several data-parallel ranks (`streamrec.learner.ranks`).

Each rank reads a static share of the samples topic's partitions (partition ``p`` belongs to
rank ``p % world``: no consumer-group rebalance) and gathers a micro-batch from them for
``interval_s`` as the single learner does, up to ``max_batch_samples`` (the cap is per rank:
a group's micro-batch holds up to ``world`` times as many). Then the ranks exchange what they
gathered (the records' values and places, all-gathered): every rank holds the same
micro-batch, ordered by partition and offset, so id admission, eviction, id statistics and
the shuffle are decided alike everywhere, and every rank takes the same number of steps. Each
scores its own records (the scores are gathered), takes its share of every mini-batch, and
the gradients are all-reduced: the weights stay identical.

One version is one snapshot, written by rank 0 alone, holding every rank's positions (the
ranks all-gather them after each micro-batch). A rank killed stops the group: the others'
next collective fails (gloo reports the closed connection) or overruns ``rank_timeout_s``,
and they leave non-zero. The group resumes from the last snapshot, each rank taking its
partitions' positions from it: with another number of ranks too, as positions are per
partition.
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
from streamrec.errors import ConfigError, InvalidSample, SnapshotError
from streamrec.kafka.records import Partition
from streamrec.kafka.source import IdleClock
from streamrec.learner.batch import Batch
from streamrec.learner.intake import decode
from streamrec.learner.ranks import RankGroup
from streamrec.learner.reports import StepResult
from streamrec.learner.runner import LearnerRunner
from streamrec.learner.trainer import TableLearner
from streamrec.samples import Sample, parse_sample
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
        requests = self.group.rank == 0 and bool(self.snapshots.requests.pending())
        head = [int(stop.is_set()), int(idle.expired()), int(requests)]
        with self.group.bounded(f"micro-batch {self.stats.micro_batches + 1}"):
            heads, places, values = self._exchange(head, records)
            stopping = any(h[0] for h in heads) or all(h[1] for h in heads)
            total = sum(len(v) for v in values)
            if total >= self._cfg.learner.min_batch_samples:
                self._train_group(records, places, values, worker)
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
        self, head: list[int], records: Sequence[Message]
    ) -> tuple[list[np.ndarray], list[np.ndarray], list[list[bytes]]]:
        """Every rank's flags, its records' places (partition, offset) and values."""
        places = np.array([[m.partition(), m.offset()] for m in records], np.int64).reshape(-1, 2)
        gathered = self.group.gather(np.concatenate([head, places.ravel()]), "exchange")
        values = self.group.gather_bytes([m.value() or b"" for m in records], "exchange")
        heads = [g[: len(head)] for g in gathered]
        return heads, [g[len(head) :].reshape(-1, 2) for g in gathered], values

    def _train_group(
        self,
        records: Sequence[Message],
        places: list[np.ndarray],
        values: list[list[bytes]],
        worker: ThreadPoolExecutor,
    ) -> None:
        """Train every rank's records as one micro-batch, in (partition, offset) order."""
        assignments = self._source.assignments
        dead = decode(records).dead
        self._dead_letter(dead, worker)  # each rank its own records'
        samples, owned = group_samples(places, values, self.group.rank)
        if samples:
            batch = Batch.from_samples(samples)
            result = self._run_held(worker.submit(group_step, self.learner, self.group, batch, owned))
            if self._on_scored is not None:
                self._run_held(worker.submit(self._on_scored, batch, result.probs))
        self._advance_positions(records, assignments)
        self._share_positions()
        if samples:
            report = self._record(batch, result, len(dead))
            if self._on_report is not None:
                self._on_report(report)
            self._count_bad(report)

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


def group_samples(
    places: Sequence[np.ndarray], values: Sequence[Sequence[bytes]], rank: int
) -> tuple[list[Sample], np.ndarray]:
    """Every rank's valid samples, by (partition, offset), and which are ``rank``'s.

    ``places[r]`` holds rank r's records' (partition, offset) rows, ``values[r]`` their values.
    """
    found: list[tuple[int, int, int, Sample]] = []
    for owner, (where, vals) in enumerate(zip(places, values, strict=True)):
        for (partition, offset), value in zip(where, vals, strict=True):
            try:
                found.append((int(partition), int(offset), owner, parse_sample(value)))
            except InvalidSample:
                continue  # dead-lettered by its own rank
    found.sort(key=lambda f: (f[0], f[1]))
    owned = np.array([f[2] == rank for f in found], bool)
    return [f[3] for f in found], owned


def group_step(learner: TableLearner, group: RankGroup, batch: Batch, owned: np.ndarray) -> StepResult:
    """Score this rank's samples (every rank's scores gathered), then train on the batch."""
    start = time.monotonic()
    encoded = learner.encode(batch)
    mine = learner.predict_encoded(encoded.take(np.flatnonzero(owned)))
    gathered = group.gather(mine.view(np.int64), "scores")
    where = group.gather(np.flatnonzero(owned), "scores")
    probs = np.empty(len(batch), np.float64)
    for rows, scores in zip(where, gathered, strict=True):
        probs[rows] = scores.view(np.float64)
    known = learner.is_known(batch)
    scored = time.monotonic()
    train = learner.learn_many(batch)
    return StepResult(probs, known, train, scored - start, time.monotonic() - scored)
