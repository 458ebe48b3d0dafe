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
mini-batch, its loss scaled to the mini-batch's mean, and the gradients are averaged: the
weights stay identical. The ranks then all-gather each sample's scores (`gather_scores`: a
40-byte record a sample, and each rank's loss and sample count), so rank 0's report and its
promotion gate judge the group's micro-batch as one process would; where the gate judges
(rank 0 says so with the micro-batch's flags), every rank scores its own samples by the served
version too.

One version is one snapshot, written by rank 0 alone, holding every rank's positions (the
ranks all-gather them after each micro-batch). A rank killed stops the group: the others'
next collective fails (gloo reports the closed connection) or overruns ``rank_timeout_s``,
and they leave non-zero. The group resumes from the last snapshot, each rank taking its
partitions' positions from it: with another number of ranks too, as positions are per
partition.

A micro-batch is trained in parts while it is gathered, as a single learner's
(`streamrec.learner.parts`): each rank gathers a part until its ``part_s`` is up or it holds
``max_part_samples`` records, and the ranks agree at each part's end, in the exchange of
places, whether the group trains the part, gathers on, or closes the micro-batch. So a rank
holds at most one part's records on a backlog, and only the last part is left at the close.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, NamedTuple, Protocol

import numpy as np
import xxhash
from confluent_kafka import Message

from streamrec.config import StreamrecConfig
from streamrec.errors import ConfigError, SnapshotError
from streamrec.kafka.records import Partition
from streamrec.kafka.source import IdleClock
from streamrec.learner.columns import SampleColumns
from streamrec.learner.intake import Intake, decode
from streamrec.learner.outputs import learner_name, raised_by
from streamrec.learner.parts import MicroBatchParts, part_cap
from streamrec.learner.ranks import GroupLayout, RankGroup
from streamrec.learner.reports import StepResult
from streamrec.learner.runner import LearnerRunner
from streamrec.learner.schedule import PartClock
from streamrec.learner.scored import Scored, gather_scores
from streamrec.learner.trainer import TableLearner
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


class _Head(NamedTuple):
    """A rank's flags in a part's exchange, sent as ints: what every rank decides the part by."""

    stopped: int
    idle: int
    requests: int  # rank 0: a snapshot was requested
    held: int  # records gathered and not trained yet
    judge: int  # rank 0: the served version its gate judges the micro-batch by; -1: none
    closing: int  # the micro-batch's close is due (its clock, or this rank's share of the cap)
    full: int  # the part ended on its count, not the clock


class _NoLock:
    def release(self) -> None:
        """Nothing held."""


class GroupGate(Protocol):
    """The promotion gate as the ranks use it (`streamrec.serving.gate.Promoter`)."""

    def due(self) -> int | None:
        """Rank 0: the served version the next micro-batch judges by; None: no judgement."""
        ...

    def served_scores(self, version: int, batch: SampleColumns) -> np.ndarray:
        """Every rank: its own samples scored by ``version``; NaN where it cannot."""
        ...

    def on_judged(
        self, labels: np.ndarray, probs: np.ndarray, served_probs: np.ndarray, served: int | None
    ) -> object:
        """Rank 0: judge the pending version by the group's micro-batch."""
        ...


def settings_fingerprint(cfg: StreamrecConfig) -> int:
    """An int64 of the settings every rank must share.

    Those that shape the model (the device aside), its features, and the samples topic (whose
    partition ``p`` is rank ``p % N``'s, and whose positions a snapshot holds for the group).
    """
    model = {k: v for k, v in cfg.model.model_dump(mode="json").items() if k != "device"}
    features = cfg.feature_schema().fingerprint
    shared = {"model": model, "features": features, "samples": cfg.kafka.samples_topic}
    text = json.dumps(shared, sort_keys=True)
    return int(np.int64(np.uint64(xxhash.xxh3_64_intdigest(text.encode()))))


class RankedRunner(LearnerRunner):
    """`LearnerRunner` as rank ``group.rank`` of ``group.world``."""

    def __init__(
        self,
        cfg: StreamrecConfig,
        learner: TableLearner,
        group: RankGroup,
        gate: GroupGate | None = None,
        **kwargs: Any,  # noqa: ANN401 - LearnerRunner's callbacks, for rank 0
    ) -> None:
        """Restore (every rank the same version), join the group's training.

        ``gate`` (every rank's) judges each pending version by the group's next micro-batch;
        ``on_scored``, which sees one batch, is refused: a rank holds only its own samples.

        Raises:
            ConfigError: online EWC is on (its penalty reads each rank's own rows).
            SnapshotError: the ranks found different newest snapshots.
            TypeError: ``on_scored`` was given.
        """
        if kwargs.get("on_scored") is not None:
            raise TypeError("learner ranks judge the group's micro-batch through gate=, not on_scored=")
        self._gate = gate
        with group.leaving_on_error():
            self._join(cfg, learner, group, **kwargs)
        # Some rank ended the last part exchanged full: each ends its next part once caught up.
        self._peer_full = False

    def _join(self, cfg: StreamrecConfig, learner: TableLearner, group: RankGroup, **kwargs: Any) -> None:  # noqa: ANN401 - as __init__
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
        settings = settings_fingerprint(cfg)
        versions = group.gather(np.array([self._snapshotted_version or -1, settings]), "restore")
        if len({int(v[1]) for v in versions}) > 1:  # weights of different shapes would abort gloo
            raise ConfigError(
                "the ranks train models of different settings (STREAMREC_MODEL__*, the declared "
                "features or STREAMREC_KAFKA__SAMPLES_TOPIC differ between hosts): every rank must read "
                "the same settings"
            )
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
        with self.group.leaving_on_error():  # the others stop at their next meeting, not after timeout_s
            return self._run(stop, upstream_done)

    def _run(self, stop: threading.Event | None, upstream_done: threading.Event | None) -> Any:  # noqa: ANN401 - LearnerStats
        stop = stop or threading.Event()
        idle = IdleClock(self._cfg.learner.stop_when_idle_s, self._source, upstream_done)
        try:
            self._check_positions()
            self._start_every_partition()
            mine = [p for p in sorted(self.positions) if self.owns(p)]
            self._source.assign(mine)
            if mine:
                logger.info(
                    "rank %d of %d reads partitions=%s",
                    self.group.rank,
                    self.group.world,
                    ",".join(str(p) for p in mine),
                )
            else:  # more ranks than partitions: a core spent on the others' samples alone
                count = len(self.positions)
                logger.warning(
                    "rank %d of %d reads no partition: %s has %d, so this rank only trains along "
                    "on the others' samples; run at most %d rank%s",
                    self.group.rank,
                    self.group.world,
                    self._cfg.kafka.samples_topic,
                    count,
                    count,
                    "" if count == 1 else "s",
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
        """Gather, exchange and train one micro-batch, a part at a time; whether the group goes on.

        Each rank gathers a part until its `PartClock` says the part ends, or it holds
        `part_cap` records; then the ranks exchange (a collective: the first there waits for
        the others) and decide alike from every rank's flags: train the part (the group holds
        enough for a part), gather on into the next, or close the micro-batch (a rank reached
        its close or its share of the cap, was stopped, a snapshot was requested, or every
        rank is idle). The positions, the report and the snapshot wait for the close. After
        a part that a rank ended full, the others end theirs once their partitions are read
        to their end: a backlog on one rank drains at the group's training rate, not a part
        at each other rank's `part_s`.
        """
        lcfg = self._cfg.learner
        assignments = self._source.assignments
        close = self._interval.next_close()
        ends = PartClock(close, lcfg.part_s)
        cap, room = part_cap(lcfg), lcfg.max_batch_samples
        due = self._gate.due() if self.group.rank == 0 and self._gate is not None else None
        parts = MicroBatchParts()
        begun = False  # the group trained a part: decided alike on every rank (unlike `parts.begun`)
        records: list[Message] = []  # this rank's, gathered and not trained yet
        intake = decode(records, self._schema)  # theirs decoded, each record once
        while True:
            limit = min(room, cap)
            until = (ends.next_end(), limit - len(records))
            new = self._collect(stop, idle, until, caught_up=self._peer_full)
            intake, records = intake.then(decode(new, self._schema), len(records)), records + new
            mine = _Head(
                stopped=int(stop.is_set()),
                idle=int(idle.expired()),
                requests=int(self.group.rank == 0 and bool(self.snapshots.requests.pending())),
                held=len(records),
                judge=-1 if due is None else due,
                closing=int(time.monotonic() >= close or len(records) >= room),
                full=int(len(records) >= limit),
            )
            with self.group.bounded(f"micro-batch {self.stats.micro_batches + 1}"):
                heads, places = self._exchange(mine, records, intake)
                self._peer_full = any(h.full for h in heads)
                stopping = any(h.stopped for h in heads) or all(h.idle for h in heads)
                closing = stopping or bool(heads[0].requests) or any(h.closing for h in heads)
                held = sum(h.held for h in heads)
                enough = lcfg.min_batch_samples if closing else max(lcfg.min_batch_samples,
                                                                    lcfg.min_eval_samples)
                if held >= enough or (closing and begun and held):  # at the close: the last part
                    judge_by = None if heads[0].judge < 0 else heads[0].judge
                    self._train_group_part(records, intake, places, judge_by, worker, parts)
                    begun, room, records, intake = True, room - len(records), [], decode([])
                    idle.busy()  # the group trains: no rank is idle (a long step is not idleness)
                if closing:
                    if begun:
                        self._close_group(parts, assignments)
                        if self.stats.micro_batches - self._snapshotted_at >= lcfg.snapshot_every:
                            self._snapshot_group()
                    elif records:
                        self._source.unread(records)  # too few to train on yet
                    if heads[0].requests:
                        self._share_positions()
                        if self.group.rank == 0:
                            LearnerRunner._serve_requests(self)
                    return not stopping

    def _serve_requests(self) -> None:
        """Served between micro-batches (`_round`), when every rank's positions are known."""

    def _exchange(
        self, head: _Head, records: Sequence[Message], intake: Intake
    ) -> tuple[list[_Head], list[np.ndarray]]:
        """Every rank's flags and its valid samples' places (partition, offset): no values."""
        places = np.array(
            [[records[i].partition(), records[i].offset()] for i in intake.kept], np.int64
        ).reshape(-1, 2)
        gathered = self.group.gather(np.concatenate([np.array(head, np.int64), places.ravel()]), "exchange")
        n = len(_Head._fields)
        return [_Head(*map(int, g[:n])) for g in gathered], [g[n:].reshape(-1, 2) for g in gathered]

    def _train_group_part(
        self,
        records: Sequence[Message],
        intake: Intake,
        places: list[np.ndarray],
        served: int | None,
        worker: ThreadPoolExecutor,
        parts: MicroBatchParts,
    ) -> None:
        """Train this rank's samples as its share of the group's part; keep the group's scores.

        The micro-batch's first part with samples is scored by the weights of the last
        snapshot, the version pending: the promotion gate judges that one by the ``served``
        version's scores (rank 0 judges, every rank scores), as one process's gate judges its
        first part.
        """
        self._dead_letter(intake.dead, worker)  # each rank its own records'
        layout = GroupLayout.of(places, self.group.rank)
        if not layout.total:
            parts.add_scored(records, None, None, 0)
            return
        first = not parts.steps  # alike on every rank: the group's layout decides
        batch = SampleColumns.from_samples(intake.samples)
        self._drift.observe(batch)  # each rank of its own samples
        where = f"learner rank {self.group.rank}, micro-batch {self.stats.micro_batches + 1}"
        result = self._run_held(worker.submit(group_step, self.learner, batch, layout, where))
        judged = self._served_scores(served if first else None, batch, layout.total, worker)
        own = Scored.of(batch, result.probs, result.known, judged)
        scored, train, dead = gather_scores(self.group.share.exchange, own, result.train, len(intake.dead))
        if first and self.group.rank == 0 and self._gate is not None:
            gate = self._gate.on_judged
            self._run_held(worker.submit(gate, scored.label, scored.probs, scored.served, served))
        parts.add_scored(records, replace(result, train=train), scored, dead)

    def _close_group(self, parts: MicroBatchParts, assignments: int) -> None:
        """Close the group's micro-batch: the positions past every part, one report of them all.

        ``assignments``: the source's count when the micro-batch began (`_advance_positions`).
        """
        self._advance_positions(parts.ends, assignments)
        self._share_positions()
        self._report(parts)

    def _served_scores(
        self, served: int | None, batch: SampleColumns, total: int, worker: ThreadPoolExecutor
    ) -> np.ndarray | None:
        """This rank's samples scored by the served version, where the gate judges by it."""
        if served is None or self._gate is None or not len(batch):
            return None
        if total < self._cfg.learner.min_eval_samples:  # too few to judge by: rank 0 will not
            return None
        return self._run_held(worker.submit(self._gate.served_scores, served, batch))

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


def group_step(learner: TableLearner, batch: SampleColumns, layout: GroupLayout, where: str) -> StepResult:
    """Score this rank's samples, then train them as its share of the group's micro-batch.

    A learner raising in its own code (a user's subclass) is named, with ``where`` (`raised_by`).
    """
    who = learner_name(learner)
    start = time.monotonic()
    with raised_by(who, "predict_many", where):
        probs = learner.predict_many(batch)
    with raised_by(who, "is_known", where):
        known = learner.is_known(batch)
    scored = time.monotonic()
    with raised_by(who, "learn_share", where):
        train = learner.learn_share(batch, layout)
    return StepResult(probs, known, train, scored - start, time.monotonic() - scored)

