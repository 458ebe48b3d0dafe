"""In-process feature store for backtests and tests; same semantics as the Redis one."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from streamrec.events import Event
from streamrec.featurestore.base import Behaviour, StoreUpdate, earliest_per_item


class MemoryFeatureStore:
    """Sequences in a dict of sorted lists; no TTL (a backtest is bounded)."""

    def __init__(self, length: int) -> None:
        self.length = length
        self._seqs: dict[str, list[Behaviour]] = {}
        self._ids: dict[str, set[str]] = {}
        self._first_seen: dict[str, int] = {}

    def update(self, events: Sequence[Event], before: Sequence[Event]) -> StoreUpdate:
        """See :meth:`FeatureStore.update`."""
        touched = set()
        for event in events:
            ids = self._ids.setdefault(event.user_id, set())
            if event.event_id in ids:
                continue
            ids.add(event.event_id)
            bisect.insort(
                self._seqs.setdefault(event.user_id, []), Behaviour.of(event), key=Behaviour.sort_key
            )
            touched.add(event.user_id)
        for item, ts in earliest_per_item(events).items():
            self._first_seen.setdefault(item, ts)
        histories = [self._history(event) for event in before]
        for user_id in touched:
            seq = self._seqs[user_id]
            for gone in seq[: -self.length]:
                self._ids[user_id].discard(gone.event_id)
            del seq[: -self.length]
        first_seen = {e.item_id: self._first_seen[e.item_id] for e in events}
        return StoreUpdate(histories, first_seen)

    def _history(self, event: Event) -> list[Behaviour]:
        seq = self._seqs.get(event.user_id, [])
        end = bisect.bisect_left(seq, event.ts, key=lambda b: b.ts)
        return seq[max(0, end - self.length) : end]

    def sequence(self, user_id: str) -> list[Behaviour]:
        """See :meth:`FeatureStore.sequence`."""
        return list(self._seqs.get(user_id, []))
