"""In-process feature store for backtests and tests; same semantics as the Redis one."""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from streamrec.features.schema import FeatureSchema
from streamrec.featurestore.base import (
    Arrival,
    Behaviour,
    FeatureStore,
    History,
    StoreUpdate,
    Verdict,
    earliest_per_item,
    users_of,
)
from streamrec.featurestore.partitions import (
    Claim,
    MemoryPartitionStore,
    PartitionBatch,
    PartitionOutcome,
)
from streamrec.kafka.records import Partition


@dataclass
class _User:
    """One user's state: the sequence, and the ids seen within the dedup horizon."""

    sequence: list[Behaviour] = field(default_factory=list)
    stored: set[str] = field(default_factory=set)  # event ids in ``sequence``
    marks: dict[str, str] = field(default_factory=dict)  # event id -> fingerprint \t origin
    by_time: list[tuple[int, str]] = field(default_factory=list)  # heap of (ts, event id)
    newest: int = 0  # the latest event time among the ids


class MemoryFeatureStore(FeatureStore):
    """Sequences in a dict of sorted lists; no TTL (a backtest is bounded).

    Examples:
        A store keeping two behaviours per user; each click asks for its point-in-time history:

        >>> from streamrec.events import Event
        >>> store = MemoryFeatureStore(length=2)
        >>> clicks = [Event(f"e{k}", "u1", f"i{k}", "c1", "click", 1_700_000_000_000 + k) for k in range(3)]
        >>> update = store.update([Arrival(e, f"0:{k}", wants_history=True) for k, e in enumerate(clicks)])
        >>> [history.items for history in update.histories]
        [(), ('i0',), ('i0', 'i1')]
        >>> [behaviour.item_id for behaviour in store.sequence("u1")]
        ['i1', 'i2']

        The same event again, from another record, is a duplicate and adds nothing:

        >>> store.update([Arrival(clicks[0], "0:9")]).verdicts
        [<Verdict.DUPLICATE: 1>]
    """

    def __init__(
        self, length: int, dedup_horizon_ms: int = 6 * 3_600_000, schema: FeatureSchema | None = None
    ) -> None:
        """An empty store keeping each user's latest ``length`` behaviours (see `FeatureStore`)."""
        super().__init__(length, dedup_horizon_ms, schema)
        self._users: dict[str, _User] = {}
        self._first_seen: dict[str, int] = {}
        self._partitions = MemoryPartitionStore()

    def attach(self, can_start_empty: bool) -> None:
        """Nothing to check: the store lives and dies with the process that fills it."""

    def reset_marker(self) -> None:
        """Nothing to mark (see `attach`)."""

    def update(self, arrivals: Sequence[Arrival], meanwhile: Callable[[], None] | None = None) -> StoreUpdate:
        """See `FeatureStore.update`."""
        users_of(arrivals)  # refuses what is not arrivals before any is stored
        if meanwhile is not None:  # nothing to overlap with: the work is all in this process
            meanwhile()
        verdicts, first_seen_at = [], []
        low: dict[str, int] = {}  # each user's earliest accepted event time in the batch
        for arrival in arrivals:
            event = arrival.event
            user = self._users.setdefault(event.user_id, _User())
            verdict, seen = _judge(user, arrival)
            verdicts.append(verdict)
            first_seen_at.append(seen)
            if verdict is not Verdict.ACCEPTED:
                continue
            low[event.user_id] = min(event.ts, low.get(event.user_id, event.ts))
            if arrival.stored and event.event_id not in user.stored:
                user.stored.add(event.event_id)
                behaviour = Behaviour.of(event, self.behaviour_features)
                bisect.insort(user.sequence, behaviour, key=Behaviour.sort_key)
        earliest = earliest_per_item(a.event for a in arrivals)  # every arrival, as Redis
        for item, ts in earliest.items():
            self._first_seen[item] = min(ts, self._first_seen.get(item, ts))
        histories = [
            self._history(a) if v is Verdict.ACCEPTED and a.wants_history else None
            for a, v in zip(arrivals, verdicts, strict=True)
        ]
        for user_id, ts in low.items():
            self._trim(self._users[user_id], ts)
        first_seen = {item: self._first_seen[item] for item in earliest}
        return StoreUpdate(first_seen, list(zip(verdicts, histories, first_seen_at, strict=True)))

    def _history(self, arrival: Arrival) -> History:
        seq = self._users[arrival.event.user_id].sequence
        end = bisect.bisect_left(seq, arrival.event.ts, key=lambda b: b.ts)
        return History.of(seq[max(0, end - self.length) : end], self.behaviour_features)

    def _trim(self, user: _User, low: int) -> None:
        """Trim a user's state, as the Redis store does.

        Keep the latest ``length`` before the batch and all from it on, and the ids within the
        horizon behind the user's newest event.
        """
        drop = bisect.bisect_left(user.sequence, low, key=lambda b: b.ts) - self.length
        for gone in user.sequence[: max(drop, 0)]:
            user.stored.discard(gone.event_id)
        del user.sequence[: max(drop, 0)]
        horizon = user.newest - self.dedup_horizon_ms
        while user.by_time and user.by_time[0][0] < horizon:
            user.marks.pop(heapq.heappop(user.by_time)[1], None)

    def claim(self, starts: Mapping[Partition, int], *, create: bool = True) -> dict[Partition, Claim]:
        """See `PartitionStore.claim`."""
        return self._partitions.claim(starts, create=create)

    def stateless(self, partitions: Iterable[Partition]) -> set[Partition]:
        """See `PartitionStore.stateless`."""
        return self._partitions.stateless(partitions)

    def advance(
        self, batches: Sequence[PartitionBatch], window_ms: int, retention_ms: int
    ) -> list[PartitionOutcome]:
        """See `PartitionStore.advance`."""
        return self._partitions.advance(batches, window_ms, retention_ms)

    def check_claims(self, epochs: Mapping[Partition, int]) -> None:
        """See `PartitionStore.check_claims`."""
        self._partitions.check_claims(epochs)

    def undecided(self) -> int:
        """The ``join`` mode's impressions still waiting for a label (`MemoryPartitionStore.undecided`)."""
        return self._partitions.undecided()

    def sequence(self, user_id: str) -> list[Behaviour]:
        """See `FeatureStore.sequence`."""
        user = self._users.get(user_id)
        return [] if user is None else user.sequence[-self.length :]


def _judge(user: _User, arrival: Arrival) -> tuple[Verdict, str]:
    """The verdict on an arrival, and where its id was first seen if it is not accepted."""
    event_id, mark = arrival.event.event_id, arrival.mark
    seen = user.marks.get(event_id)
    if seen is None:
        user.marks[event_id] = mark
        heapq.heappush(user.by_time, (arrival.event.ts, event_id))
        if arrival.stored:  # as in Redis: the newest entry of the sequence
            user.newest = max(user.newest, arrival.event.ts)
        return Verdict.ACCEPTED, ""
    if seen == mark:
        return Verdict.ACCEPTED, ""
    fingerprint, _, origin = seen.partition("\t")
    if fingerprint != arrival.event.fingerprint():
        return Verdict.CONFLICT, origin
    return Verdict.DUPLICATE, origin
