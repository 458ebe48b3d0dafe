"""Per-partition state that must survive restarts.

The watermark, and the impression windows of the ``join`` labelling mode.

Every change is stamped with the offset of the record that made it (a closure with the
partition's last offset in its batch), and the state is read *as of* an offset: a batch that
starts at offset ``c`` (the committed offset) first undoes what its partition's previous,
uncommitted batch did at offsets ≥ ``c``. So a batch redone after an abort, a crash or a
rebalance, whatever its size, finds the state exactly as the committed offset left it and
decides exactly what a clean run decides: each impression yields one sample, once. Only one
batch per partition can be uncommitted at a time, so undoing the last batch's changes is
enough; the keys it touched are kept for that.

A process must not write to a partition another process has taken over since: a
`PartitionStore.claim` (at each assignment) raises the partition's epoch, and a batch
from an older epoch (a consumer paused past its session timeout, then resumed) is refused
with `PartitionFenced`; so is its commit, checked just before by
`PartitionStore.check_claims` (the pause may fall between its writes and its commit).

A durable store (Redis) keeps each partition's small ``part`` record (epoch, watermark) for good,
whatever its TTL on the rest: a partition it holds nothing of while the consumers' group has
committed an offset past 0 on it lost its state (an AOF replayed without its scripts' writes,
keys deleted), and the consumers refuse it as a lost store (`lost_reason`). So a claim of a
durable store made with ``create=False`` writes nothing for a partition it finds no state of
(`Claim.found`): the consumer first asks the broker, and only a partition the group never
committed on is then claimed afresh. The in-memory stores start empty with their process, and
never say so.

Join windows (one per impression): an impression at ``ts`` waits for a click on the same
user and item with an event time in ``[ts, ts + window_ms]``; the latest such impression
before a click takes it (last touch) and becomes a positive sample at once. When the
partition's watermark passes ``ts + window_ms`` an impression without a click becomes a
negative. A click after that is late by the same watermark: it makes no sample, and it is
counted as a late label if the watermark passed its window less than ``retention_ms`` before
(closed windows are kept that long).

A window keeps what its impression's sample needs beside its history: with declared features,
the sample's features and the history's, as of the impression's time (`JoinInput.features`).
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from streamrec.errors import FeatureStoreLost, PartitionFenced
from streamrec.events import Event
from streamrec.features.schema import Value
from streamrec.kafka.records import Partition

#: A decided sample's declared features (`Sample.features`) and its history's
#: (`Sample.seq_features`), as of its impression's time.
Features = dict[str, Value]
SeqFeatures = dict[str, tuple[Value | None, ...]]

#: What a join input is: an impression opening a window, a click that may take one, or a click
#: judged late that can only be counted.
JoinKind = Literal["impression", "click", "late_click"]


class JoinInput(msgspec.Struct, frozen=True):
    """One event of a partition for the join, in offset order.

    An impression carries its history (the user's behaviours strictly before it) and, with
    declared features, its sample's features and its history's as of its time (kept in its
    window for its decision); a late click the watermark it was judged late by. A frozen
    msgspec struct, as `Event`: one per event, made three times as fast as a frozen dataclass.
    """

    kind: JoinKind
    offset: int
    event: Event
    items: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    watermark: int = 0
    features: Features | None = None  # None, not {}: msgspec would make two dicts an impression
    seq_features: SeqFeatures | None = None


@dataclass(frozen=True, slots=True)
class PartitionBatch:
    """What one batch read from a partition.

    Offsets ``first``..``last``, the newest event time seen there after it (None: no valid event
    yet), the lateness allowed behind it (the watermark windows close at; None: no join, nothing
    closes), its join inputs in offset order, and whether its impressions carry declared
    features (`JoinInput.features`).
    """

    partition: Partition
    epoch: int
    first: int
    last: int
    newest: int | None
    allowed_ms: int | None = None
    inputs: tuple[JoinInput, ...] = ()
    featured: bool = False


class Decision(msgspec.Struct, frozen=True):
    """An impression's label, decided.

    1 by a click inside its window, 0 when it closed, with what its impression's `JoinInput`
    carried (a frozen msgspec struct, as `JoinInput`).
    """

    label: int
    user_id: str
    event_id: str
    item_id: str
    category_id: str
    ts: int
    items: tuple[str, ...]
    categories: tuple[str, ...]
    features: Features | None = None  # None, not {}: msgspec would make two dicts an impression
    seq_features: SeqFeatures | None = None


@dataclass(frozen=True, slots=True)
class PartitionOutcome:
    """What a batch decided on its partition.

    The labels decided (positives in click order, then the negatives its watermark closed), the
    offsets of the clicks that took or hit an impression (they make no sample of their own), and
    the late clicks that hit a closed window.
    """

    decisions: list[Decision] = field(default_factory=list)
    taken: frozenset[int] = frozenset()
    late_labels: int = 0


@dataclass(frozen=True, slots=True)
class Claim:
    """A partition claimed.

    The epoch its batches carry, and the newest event time seen on it before the offset it is
    read from (None if nothing was). ``found`` is False when the store held no state of it: a
    claim made with ``create=False`` then wrote nothing (its epoch is 0), one with ``create``
    started its state (epoch 1).
    """

    epoch: int
    newest: int | None
    found: bool = True


class PartitionStore(ABC):
    """Claims partitions and advances their state batch by batch (see the module docstring)."""

    #: Whether partitions' state outlives the process that wrote it (Redis): only then is a
    #: partition found without state while its group committed past 0 on it a loss.
    durable: bool = False

    @abstractmethod
    def claim(self, starts: Mapping[Partition, int], *, create: bool = True) -> dict[Partition, Claim]:
        """Take over partitions about to be read from these offsets.

        A partition without state is started afresh, or with ``create`` False left as it is
        (`Claim.found`); an in-memory store always starts it.
        """

    @abstractmethod
    def stateless(self, partitions: Iterable[Partition]) -> set[Partition]:
        """Which of ``partitions`` the store holds no state of (never claimed, or lost).

        A durable store keeps the state it finds for good (one written by a version that let
        it expire, `streamrec.featurestore.redis_partitions`).
        """

    def lost_reason(self, lost: Mapping[Partition, int]) -> str:
        """Why consumers refuse this store: it holds no state of ``lost`` (-> their committed offsets)."""
        return lost_reason("the feature store", lost)

    @abstractmethod
    def advance(
        self, batches: Sequence[PartitionBatch], window_ms: int, retention_ms: int
    ) -> list[PartitionOutcome]:
        """Apply each batch to its partition's state, undoing its uncommitted predecessor first.

        Raises:
            PartitionFenced: a batch's epoch is not its partition's: another process took over.
        """

    @abstractmethod
    def check_claims(self, epochs: Mapping[Partition, int]) -> None:
        """Check that no other process claimed these partitions since they were claimed at these epochs.

        A consumer asks before it commits a batch, so that one stalled past its session timeout
        after its writes does not commit what the new owner commits too.

        Raises:
            PartitionFenced: a partition's epoch is no longer the one given.
        """


@dataclass(slots=True)
class _Window:
    user_id: str
    event_id: str
    item_id: str
    category_id: str
    ts: int
    deadline: int
    items: tuple[str, ...]
    categories: tuple[str, ...]
    opened: int
    clicked: int = -1
    closed: int = -1
    features: Features | None = None
    seq_features: SeqFeatures | None = None

    def decision(self, label: int) -> Decision:
        return Decision(label, self.user_id, self.event_id, self.item_id, self.category_id, self.ts,
                        self.items, self.categories, self.features, self.seq_features)


WindowKey = tuple[str, str]  # user, event id


@dataclass
class _State:
    epoch: int = 0
    newest: int | None = None
    stamp: int = -1  # the last offset of the batch that set ``newest``
    before: tuple[int | None, int] = (None, -1)  # ``newest`` and ``stamp`` before that
    windows: dict[WindowKey, _Window] = field(default_factory=dict)
    pairs: dict[tuple[str, str], list[WindowKey]] = field(default_factory=dict)  # user, item
    due: list[tuple[int, WindowKey]] = field(default_factory=list)  # heap: deadline
    done: list[tuple[int, WindowKey]] = field(default_factory=list)  # heap: deadline + retention
    touched: set[WindowKey] = field(default_factory=set)  # by the last batch


class MemoryPartitionStore(PartitionStore):
    """The partition state in process memory: what the Redis store keeps, kept the same way."""

    def __init__(self) -> None:
        """No partition claimed yet."""
        self._states: dict[Partition, _State] = {}

    def claim(self, starts: Mapping[Partition, int], *, create: bool = True) -> dict[Partition, Claim]:
        """See `PartitionStore.claim`: it lives with its process, so it always starts one afresh."""
        out = {}
        for key, start in starts.items():
            found = key in self._states
            state = self._states.setdefault(key, _State())
            state.epoch += 1
            newest = state.newest if state.stamp < start else state.before[0]
            out[key] = Claim(state.epoch, newest, found)
        return out

    def stateless(self, partitions: Iterable[Partition]) -> set[Partition]:
        """See `PartitionStore.stateless`."""
        return {key for key in partitions if key not in self._states}

    def advance(
        self, batches: Sequence[PartitionBatch], window_ms: int, retention_ms: int
    ) -> list[PartitionOutcome]:
        """See `PartitionStore.advance`."""
        self.check_claims({b.partition: b.epoch for b in batches})  # refuse before changing anything
        return [self._advance(self._states[b.partition], b, window_ms, retention_ms) for b in batches]

    def check_claims(self, epochs: Mapping[Partition, int]) -> None:
        """See `PartitionStore.check_claims`."""
        for partition, ours in epochs.items():
            epoch = self._states.get(partition, _State()).epoch
            if epoch != ours:
                raise PartitionFenced(fenced_reason(partition, ours, epoch))

    def undecided(self) -> int:
        """The impressions whose windows are open: neither clicked nor closed yet (no label)."""
        return sum(
            w.clicked < 0 and w.closed < 0 for state in self._states.values() for w in state.windows.values()
        )

    def _advance(
        self, state: _State, batch: PartitionBatch, window_ms: int, retention_ms: int
    ) -> PartitionOutcome:
        _undo(state, batch.first)
        decisions: list[Decision] = []
        taken: set[int] = set()
        late = 0
        for item in batch.inputs:
            event = item.event
            pair = (event.user_id, event.item_id)
            if item.kind == "impression":
                key = (event.user_id, event.event_id)
                if key not in state.windows:
                    state.windows[key] = _Window(
                        event.user_id, event.event_id, event.item_id, event.category_id, event.ts,
                        event.ts + window_ms, item.items, item.categories, item.offset,
                        features=item.features, seq_features=item.seq_features,
                    )
                    state.pairs.setdefault(pair, []).append(key)
                    heapq.heappush(state.due, (event.ts + window_ms, key))
                    state.touched.add(key)
                continue
            windows = [state.windows[k] for k in state.pairs.get(pair, ())]
            if item.kind == "late_click":
                late += _hits(windows, event.ts, item.watermark, retention_ms)
                continue
            open_ = [w for w in windows if w.closed < 0 and w.ts <= event.ts <= w.deadline]
            if open_:
                last = max(open_, key=lambda w: (w.ts, w.event_id))
                taken.add(item.offset)
                if last.clicked < 0:
                    last.clicked = item.offset
                    decisions.append(last.decision(1))
                    state.touched.add((last.user_id, last.event_id))
        if batch.allowed_ms is not None and batch.newest is not None:
            if state.newest is not None:  # as of the batch's start: what any redo would forget too
                _purge(state, state.newest - batch.allowed_ms)
            decisions += _close(state, batch, batch.newest - batch.allowed_ms, retention_ms)
        state.before = (state.newest, state.stamp)
        state.newest, state.stamp = batch.newest, batch.last
        return PartitionOutcome(decisions, frozenset(taken), late)


#: What a fenced consumer is told.
FENCED_ADVICE = (
    "a partition was claimed by another consumer since this one read it: this process was "
    "stalled past its session timeout; it stops so that it cannot undo the new owner's work "
    "(restart it to rejoin the group)"
)


def refuse_lost(store: PartitionStore, committed: Mapping[Partition, int]) -> None:
    """Refuse a durable store that holds no state of a partition its group committed past 0 on.

    ``committed``: the group's committed offset on each partition (negative: none).

    Raises:
        FeatureStoreLost: naming each such partition and its committed offset.
    """
    if not store.durable:
        return
    past = {key: offset for key, offset in committed.items() if offset > 0}
    lost = {key: past[key] for key in store.stateless(past)}
    if lost:
        raise FeatureStoreLost(store.lost_reason(lost))


def lost_reason(where: str, lost: Mapping[Partition, int]) -> str:
    """Why consumers refuse a store holding no state of ``lost`` (partitions -> their committed offsets)."""
    named = ", ".join(f"{key} (committed offset {offset})" for key, offset in sorted(lost.items()))
    return (
        f"{where} lost the state of partition{'s' if len(lost) > 1 else ''} {named}: the consumers' "
        "group committed offsets there, but the store holds nothing of it (Redis replayed an AOF "
        "without its scripted writes, or the keys were deleted), so its sequences are likely gone "
        "too: stop the consumers and run `streamrec consumers rebuild`"
    )


def fenced_reason(partition: Partition, ours: int, theirs: object) -> str:
    """Why a batch of ``partition`` claimed at epoch ``ours`` is refused (it is at ``theirs``)."""
    return f"{FENCED_ADVICE} (partition {partition}, epoch {theirs}, ours {ours})"


def _hits(windows: list[_Window], ts: int, watermark: int, retention_ms: int) -> bool:
    """Whether a late click would have labelled a closed window.

    Whether a late click at ``ts`` fell in the window of an impression without a click that
    its watermark had closed (up to ``retention_ms`` before): a late label. Whether the
    closure itself ran yet depends on where batches end; this does not.
    """
    return any(
        w.clicked < 0 and w.ts <= ts <= w.deadline < watermark <= w.deadline + retention_ms
        for w in windows
    )


def _undo(state: _State, first: int) -> None:
    """Undo an uncommitted batch's changes to a partition's state.

    Undo what was done at offsets ≥ ``first`` (the previous batch, if it never committed:
    it ended at ``state.stamp``, so before ``first`` it did).
    """
    if state.stamp < first:
        state.touched = set()
        return
    for key in state.touched:
        window = state.windows.get(key)
        if window is None:
            continue
        if window.opened >= first:
            del state.windows[key]
            _unpair(state, window)
            continue
        if window.clicked >= first:
            window.clicked = -1
        if window.closed >= first:
            window.closed = -1
            heapq.heappush(state.due, (window.deadline, key))
    state.touched = set()
    if state.stamp >= first:
        state.newest, state.stamp = state.before


def _close(state: _State, batch: PartitionBatch, watermark: int, retention_ms: int) -> list[Decision]:
    """Close the windows the watermark passed: negatives for those without a click."""
    out = []
    while state.due and state.due[0][0] < watermark:
        deadline, key = heapq.heappop(state.due)
        window = state.windows.get(key)
        if window is None or window.closed >= 0 or window.deadline != deadline:
            continue  # gone, or already closed (an undone closure pushes a second entry)
        window.closed = batch.last
        state.touched.add(key)
        heapq.heappush(state.done, (deadline + retention_ms, key))
        if window.clicked < 0:
            out.append(window.decision(0))
    return out


def _purge(state: _State, watermark: int) -> None:
    """Forget the closed windows whose retention the committed watermark has passed.

    No late click of this batch or a later one can count them.
    """
    while state.done and state.done[0][0] < watermark:
        _, key = heapq.heappop(state.done)
        window = state.windows.get(key)
        if window is None or window.closed < 0:
            continue  # gone, or reopened by an undo (a new entry comes when it closes again)
        del state.windows[key]
        _unpair(state, window)


def _unpair(state: _State, window: _Window) -> None:
    pair = (window.user_id, window.item_id)
    state.pairs[pair].remove((window.user_id, window.event_id))
    if not state.pairs[pair]:
        del state.pairs[pair]
