"""The feature-store interface and the behaviour value it holds."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from streamrec.events import Event

SEP = "\t"  # ids are printable (the contract forbids tabs), so a tab cannot occur inside one


@dataclass(frozen=True, slots=True)
class Behaviour:
    """One entry of a user's sequence."""

    ts: int
    event_id: str
    item_id: str
    category_id: str
    action: str

    @classmethod
    def of(cls, event: Event) -> Behaviour:
        """The behaviour an event adds to its user's sequence."""
        return cls(event.ts, event.event_id, event.item_id, event.category_id, event.action)

    def member(self) -> str:
        """Stable encoding; event id first, so equal-time entries order by event id."""
        return SEP.join((self.event_id, self.item_id, self.category_id, self.action))

    @classmethod
    def from_member(cls, member: str, ts: int) -> Behaviour:
        """Inverse of :meth:`member`."""
        event_id, item_id, category_id, action = member.split(SEP)
        return cls(ts, event_id, item_id, category_id, action)

    def sort_key(self) -> tuple[int, str]:
        """Sequence order: event time, then the encoded member (Redis sorted-set order)."""
        return self.ts, self.member()


@dataclass(frozen=True, slots=True)
class StoreUpdate:
    """What :meth:`FeatureStore.update` returns.

    ``histories[i]`` is the point-in-time history of ``before[i]``; ``first_seen`` maps every
    item of the batch to the earliest event time the store has recorded for it.
    """

    histories: list[list[Behaviour]]
    first_seen: dict[str, int]


def earliest_per_item(events: Sequence[Event]) -> dict[str, int]:
    """The earliest event time of each item in ``events``."""
    earliest: dict[str, int] = {}
    for event in events:
        if event.ts < earliest.get(event.item_id, event.ts + 1):
            earliest[event.item_id] = event.ts
    return earliest


class FeatureStore(ABC):
    """Event-time-ordered, length-capped behaviour sequences per user.

    Appending is idempotent (an event id is stored once), and a store keeps, besides each
    user's latest ``length`` behaviours, what a batch's own histories need until the next
    batch: so a batch redone after an aborted commit leaves the store as it was and reads
    exactly the same histories again. Implementations
    subclass this explicitly; ``streamrec.featurestore.make_feature_store`` picks one from
    the configuration.
    """

    def __init__(self, length: int) -> None:
        """Keep each user's latest ``length`` behaviours."""
        self.length = length

    @abstractmethod
    def update(self, events: Sequence[Event], before: Sequence[Event]) -> StoreUpdate:
        """Append ``events``; then, for each event in ``before``, return its user's history.

        A history holds the latest ``length`` behaviours strictly earlier than that event's
        ``ts``, oldest first: the point-in-time view a training sample may see. The first
        time an item is seen is recorded once and returned for every item of the batch.
        """

    @abstractmethod
    def sequence(self, user_id: str) -> list[Behaviour]:
        """The user's latest ``length`` behaviours, oldest first."""
