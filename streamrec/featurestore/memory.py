"""In-process feature store for backtests and tests; same semantics as the Redis one."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from streamrec.events import Event
from streamrec.featurestore.base import Behaviour, FeatureStore, StoreUpdate, earliest_per_item


class MemoryFeatureStore(FeatureStore):
    """Sequences in a dict of sorted lists; no TTL (a backtest is bounded)."""

    def __init__(self, length: int) -> None:
        """An empty store keeping each user's latest ``length`` behaviours."""
        super().__init__(length)
        self._seqs: dict[str, list[Behaviour]] = {}
        self._ids: dict[str, set[str]] = {}
        self._first_seen: dict[str, int] = {}

    def update(self, events: Sequence[Event], before: Sequence[Event]) -> StoreUpdate:
        """See :meth:`FeatureStore.update`."""
        low: dict[str, int] = {}  # each user's earliest event time in the batch
        for event in events:
            low[event.user_id] = min(event.ts, low.get(event.user_id, event.ts))
            ids = self._ids.setdefault(event.user_id, set())
            if event.event_id in ids:
                continue
            ids.add(event.event_id)
            bisect.insort(
                self._seqs.setdefault(event.user_id, []), Behaviour.of(event), key=Behaviour.sort_key
            )
        for item, ts in earliest_per_item(events).items():
            self._first_seen.setdefault(item, ts)
        histories = [self._history(event) for event in before]
        for user_id, ts in low.items():
            # As in Redis: keep the latest `length` before the batch, and all from it on.
            seq = self._seqs[user_id]
            drop = bisect.bisect_left(seq, ts, key=lambda b: b.ts) - self.length
            for gone in seq[: max(drop, 0)]:
                self._ids[user_id].discard(gone.event_id)
            del seq[: max(drop, 0)]
        first_seen = {e.item_id: self._first_seen[e.item_id] for e in events}
        return StoreUpdate(histories, first_seen)

    def _history(self, event: Event) -> list[Behaviour]:
        seq = self._seqs.get(event.user_id, [])
        end = bisect.bisect_left(seq, event.ts, key=lambda b: b.ts)
        return seq[max(0, end - self.length) : end]

    def sequence(self, user_id: str) -> list[Behaviour]:
        """See :meth:`FeatureStore.sequence`."""
        return self._seqs.get(user_id, [])[-self.length :]
