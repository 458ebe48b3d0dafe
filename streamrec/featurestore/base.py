"""The feature-store interface and the behaviour value it holds."""

from __future__ import annotations

import logging
import types
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import overload

import msgspec

from streamrec.closing import Closing
from streamrec.errors import ConfigError, a_kind
from streamrec.events import Event
from streamrec.features.schema import FeatureSchema, FeatureSpec, Value
from streamrec.featurestore import values
from streamrec.featurestore.partitions import PartitionStore

logger = logging.getLogger(__name__)

SEP = "\t"  # ids are printable (the contract forbids tabs), so a tab cannot occur inside one


#: The features along a history of the default schema: none (shared, read-only).
NO_COLUMNS: Mapping[str, tuple[Value | None, ...]] = types.MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Behaviour:
    """One entry of a user's sequence.

    ``extras`` holds its declared behaviour features' values, encoded as the entry carries
    them (`streamrec.featurestore.values`; ``""`` in the default schema): `values` reads them.
    """

    ts: int
    event_id: str
    item_id: str
    category_id: str
    action: str
    extras: str = ""

    @classmethod
    def of(cls, event: Event, specs: Sequence[FeatureSpec] = ()) -> Behaviour:
        """The behaviour an event adds to its user's sequence, with its values of ``specs``."""
        if specs:
            extras = values.encode(event.features, specs)
            return cls(event.ts, event.event_id, event.item_id, event.category_id, event.action, extras)
        return cls(event.ts, event.event_id, event.item_id, event.category_id, event.action)

    def member(self) -> str:
        """Stable encoding; event id first, so equal-time entries order by event id."""
        if self.extras:
            return SEP.join((self.event_id, self.item_id, self.category_id, self.action + self.extras))
        return SEP.join((self.event_id, self.item_id, self.category_id, self.action))

    @classmethod
    def from_member(cls, member: str, ts: int) -> Behaviour:
        """Inverse of `member`."""
        event_id, item_id, category_id, action = member.split(SEP)
        return cls(ts, event_id, item_id, category_id, *values.split(action))

    def values(self, specs: Sequence[FeatureSpec]) -> tuple[Value | None, ...]:
        """Its values of ``specs`` (the store's behaviour features), None where it has none."""
        return values.decode(self.extras, specs)

    def sort_key(self) -> tuple[int, str]:
        """Sequence order: event time, then the encoded member (Redis sorted-set order)."""
        return self.ts, self.member()


class History(Sequence[Behaviour]):
    """A point-in-time history: behaviours oldest first.

    ``items`` and ``categories``, what a sample carries, are tuples from the start; the
    behaviours themselves are made only when asked for: making 50 of them per event cost the
    consumers ~40 us an event once histories were full. ``features`` holds each declared
    behaviour feature along the history, by name, aligned with ``items`` (None where a
    behaviour has no value: stored before the feature was declared, or missing); empty in
    the default schema, and for an empty history.
    """

    __slots__ = ("_made", "_make", "categories", "items")
    # a class attribute: the default schema's histories, most of them, set nothing more
    features: Mapping[str, tuple[Value | None, ...]] = NO_COLUMNS

    def __init__(
        self, items: tuple[str, ...], categories: tuple[str, ...], make: Callable[[], list[Behaviour]]
    ) -> None:
        """A history of ``items`` and ``categories``; ``make()`` gives its behaviours."""
        self.items = items
        self.categories = categories
        self._make = make
        self._made: list[Behaviour] | None = None

    @classmethod
    def of(cls, behaviours: list[Behaviour], specs: Sequence[FeatureSpec] = ()) -> History:
        """The history of these behaviours (oldest first), with their values of ``specs``."""
        items = tuple([b.item_id for b in behaviours])
        categories = tuple([b.category_id for b in behaviours])
        if specs and behaviours:
            rows = [b.values(specs) for b in behaviours]
            features = {spec.name: tuple([row[k] for row in rows]) for k, spec in enumerate(specs)}
            return FeaturedHistory(items, categories, lambda: behaviours, features)
        return cls(items, categories, lambda: behaviours)

    def behaviours(self) -> list[Behaviour]:
        """The behaviours, oldest first."""
        if self._made is None:
            self._made = self._make()
        return self._made

    def __len__(self) -> int:
        """How many behaviours."""
        return len(self.items)

    @overload
    def __getitem__(self, index: int) -> Behaviour: ...

    @overload
    def __getitem__(self, index: slice) -> list[Behaviour]: ...

    def __getitem__(self, index: int | slice) -> Behaviour | list[Behaviour]:
        """A behaviour, or a list of them."""
        return self.behaviours()[index]

    def __iter__(self) -> Iterator[Behaviour]:
        """The behaviours, oldest first."""
        return iter(self.behaviours())

    def __eq__(self, other: object) -> bool:
        """Equal to a history or a list of the same behaviours."""
        if isinstance(other, History):
            return self.behaviours() == other.behaviours()
        return isinstance(other, list) and self.behaviours() == other

    __hash__ = None  # type: ignore[assignment]  # mutable cache, compared by value: unhashable

    def __repr__(self) -> str:
        """As the list of behaviours."""
        return f"History({self.behaviours()!r})"


class FeaturedHistory(History):
    """A `History` with its declared behaviour features along it."""

    __slots__ = ("features",)

    def __init__(
        self,
        items: tuple[str, ...],
        categories: tuple[str, ...],
        make: Callable[[], list[Behaviour]],
        features: Mapping[str, tuple[Value | None, ...]],
    ) -> None:
        """See `History`; ``features`` by name, aligned with ``items``."""
        super().__init__(items, categories, make)
        self.features = features


class Verdict(IntEnum):
    """What the store made of an arriving event, by its id."""

    ACCEPTED = 0  # first seen, or its own record read again (a batch redone after an abort)
    DUPLICATE = 1  # the same content already arrived from another record: yields nothing
    CONFLICT = 2  # the id already arrived with other content: the event is dead-lettered


# The verdicts as plain names for code that asks them per event: an enum class's attribute
# is looked up through ``EnumType.__getattr__`` (Python 3.11), ten times a global's cost.
ACCEPTED, DUPLICATE, CONFLICT = Verdict.ACCEPTED, Verdict.DUPLICATE, Verdict.CONFLICT


class Arrival(msgspec.Struct, frozen=True, gc=False):
    """An event as it reaches the store.

    An event as it reaches the store (a frozen msgspec struct, untracked by the garbage
    collector, as `Event`: one per record).

    ``origin`` names the record it came in (``partition:offset``): the same record read again
    is a redo, the same content from another record a duplicate. ``wants_history`` asks for
    the point-in-time history a sample of it needs. An arrival not ``stored`` (an impression:
    an exposure, not behaviour) is judged by its id but stays out of the sequence.
    """

    event: Event
    origin: str
    wants_history: bool = False
    stored: bool = True

    @property
    def mark(self) -> str:
        """What the store remembers of the arrival: its content fingerprint and origin."""
        return f"{self.event.fingerprint()}{SEP}{self.origin}"


#: What the store made of one arrival: its verdict, its point-in-time history (an accepted
#: arrival that wanted one, else None) and, for a duplicate or a conflict, the origin its id
#: first came from (else "").
Answer = tuple[Verdict, History | None, str]


class StoreUpdate:
    """What `FeatureStore.update` returns.

    ``first_seen`` maps the item of every arrival to the earliest event time the store has
    recorded for it. `answers` gives each arrival's `Answer`, in arrival order,
    as the store delivers them: a Redis store hands out the first while Redis still works on
    later users, so the caller's work on them overlaps the store's. `all`,
    ``verdicts``, ``histories`` and ``first_seen_at`` read them all. Use it as a context
    manager, or `close` it, when the answers may be left unread (an error on the way):
    a store holding a connection for them drops it.
    """

    __slots__ = ("_close", "_read", "_source", "first_seen")

    def __init__(
        self,
        first_seen: dict[str, int],
        answers: Iterable[Answer],
        close: Callable[[], None] | None = None,
    ) -> None:
        """``answers`` one per arrival, read once; ``close`` gives up the unread rest."""
        self.first_seen = first_seen
        self._source: Iterator[Answer] | None = iter(answers)
        self._read: list[Answer] | None = None
        self._close = close

    def answers(self) -> Iterator[Answer]:
        """Each arrival's answer, in order, as it arrives: one pass."""
        if self._read is not None:
            return iter(self._read)
        if self._source is None:
            raise RuntimeError("the answers of a store update are read once")
        source, self._source = self._source, None
        return source

    def all(self) -> list[Answer]:
        """Every answer, read now: the update is in the store."""
        if self._read is None:
            self._read = list(self.answers())
        return self._read

    @property
    def verdicts(self) -> list[Verdict]:
        """Each arrival's verdict."""
        return [answer[0] for answer in self.all()]

    @property
    def histories(self) -> list[History | None]:
        """Each arrival's history: an accepted one's that wanted it, else None."""
        return [answer[1] for answer in self.all()]

    @property
    def first_seen_at(self) -> list[str]:
        """For each duplicate or conflict the origin its id first came from, else ``""``."""
        return [answer[2] for answer in self.all()]

    def close(self) -> None:
        """Give up the answers not read yet."""
        if self._close is not None:
            self._close()

    def __enter__(self) -> StoreUpdate:
        """The update itself; `close` on the way out."""
        return self

    def __exit__(self, *exc: object) -> None:
        """See `close`."""
        self.close()


def behaviour_features(schema: FeatureSchema) -> tuple[FeatureSpec, ...]:
    """The features a behaviour is stored with: ``schema``'s declared behaviour ones, in order."""
    return tuple(spec for spec in schema.extras if spec.role == "behaviour")


def _topic_epoch(stored: str | None, topic_id: str | None) -> tuple[int, str | None]:
    """The events topic ``topic_id``'s epoch after ``stored``, and the topic id it replaces.

    See `FeatureStore.events_topic`. None replaced: the same topic, the first, or one without an id.
    """
    if stored is None:
        return 1, None
    before, _, epoch = stored.rpartition(SEP)
    if topic_id is None or before == topic_id:
        return int(epoch), None
    return int(epoch) + 1, before


def users_of(arrivals: Sequence[Arrival]) -> list[str]:
    """Each arrival's user id, as `FeatureStore.update` reads them first.

    Raises:
        TypeError: ``arrivals`` is not a sequence of `Arrival` of events, named by the item.
    """
    if not isinstance(arrivals, Sequence):
        raise TypeError(f"update takes a sequence of Arrival, not a sequence: {a_kind(arrivals)}")
    try:
        return [arrival.event.user_id for arrival in arrivals]
    except AttributeError:
        for index, item in enumerate(arrivals):
            if not isinstance(item, Arrival):
                wrap = ": wrap each event as Arrival(event, origin)" if isinstance(item, Event) else ""
                raise TypeError(
                    f"update takes a sequence of Arrival, but item {index} is {a_kind(item)} "
                    f"{item!r:.80}{wrap}"
                ) from None
            if not isinstance(item.event, Event):
                raise TypeError(
                    f"update takes a sequence of Arrival of events, but item {index} is an Arrival of "
                    f"{a_kind(item.event)}, not of an Event"
                ) from None
        raise


def earliest_per_item(events: Iterable[Event]) -> dict[str, int]:
    """The earliest event time of each item in ``events``."""
    earliest: dict[str, int] = {}
    for event in events:
        if event.ts < earliest.get(event.item_id, event.ts + 1):
            earliest[event.item_id] = event.ts
    return earliest


class FeatureStore(PartitionStore, Closing):
    """Event-time-ordered, length-capped behaviour sequences per user, and the event ids seen.

    And, as a `PartitionStore`, each partition's watermark and impression windows.

    An event id yields its behaviour once: the store remembers each id, with a fingerprint of
    its content and the record it came in, for ``dedup_horizon_ms`` of the user's event time.
    The same record read again (a batch redone after an aborted commit) is accepted again and
    reads exactly the same histories: besides each user's latest ``length`` behaviours the
    store keeps what a batch's own histories need until the next batch. Implementations
    subclass this explicitly; ``streamrec.featurestore.make_feature_store`` picks one from
    the configuration. A store is closed by `close` or a ``with`` block: Redis's gives back
    its connections.
    """

    def __init__(self, length: int, dedup_horizon_ms: int, schema: FeatureSchema | None = None) -> None:
        """Keep each user's latest ``length`` behaviours and ``dedup_horizon_ms`` of ids.

        With each behaviour, its values of ``schema``'s declared behaviour features (outcomes
        included), returned along its histories (`History.features`).

        Raises:
            ConfigError: ``length`` is not an int of at least 1, or ``dedup_horizon_ms`` one of
                at least 0 (the bounds of ``model.sequence_length`` and ``consumer.dedup_horizon_ms``).
        """
        for name, value, least in (("length", length, 1), ("dedup_horizon_ms", dedup_horizon_ms, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ConfigError(f"{name} must be an int of at least {least}, not {value!r}")
        self.length = length
        self.dedup_horizon_ms = dedup_horizon_ms
        self.schema = schema or FeatureSchema.default()
        self.behaviour_features = behaviour_features(self.schema)

    @abstractmethod
    def attach(self, can_start_empty: bool) -> None:
        """Check, before the first update, that the store holds what it held before.

        A store that can lose its data independently of the process (Redis without
        persistence) keeps a marker and checks it at every update. ``can_start_empty``
        says a new, empty store is expected (nothing was ever processed); otherwise an
        empty store is a lost one.

        Raises:
            FeatureStoreLost: the store lost its data; rebuild it from the events topic.
        """

    @abstractmethod
    def reset_marker(self) -> None:
        """Declare the store's present contents good (after a rebuild)."""

    def events_topic(self, topic_id: str | None) -> str:
        """What the origins of the events topic ``topic_id``'s records end with (`Arrival.origin`).

        The store remembers an event by the record it came in, ``partition:offset``: read again,
        the same record is a batch redone and yields its samples again. A topic created again
        (a new topic id: deleted by an operator, or a broker that keeps nothing restarted) starts
        its offsets over, so its records take an ending of their own: "" for the first topic the
        store saw, then ``@2``, ``@3``, ...; an event published again into the new topic is
        then a duplicate, never a redo. Brokers without topic ids (before Kafka 2.8) keep the
        ending the store has.

        Returns:
            The ending, and logs a warning when the topic is new to the store.
        """
        stored = self._stored_events_topic()
        epoch, replaced = _topic_epoch(stored, topic_id)
        if topic_id is not None and (stored is None or replaced is not None):
            self._store_events_topic(f"{topic_id}{SEP}{epoch}")
        if replaced is not None:
            logger.warning(
                "the events topic is not the one the feature store last read (topic id %s, now %s): "
                "it was created again, or STREAMREC_KAFKA__EVENTS_TOPIC names another topic; its "
                "records are told apart from the old one's, and an event published again into it is a "
                "duplicate topic_epoch=%d",
                replaced, topic_id, epoch,
            )
        return "" if epoch == 1 else f"@{epoch}"

    def _stored_events_topic(self) -> str | None:
        """The topic id and epoch, tab-separated, as `events_topic` stored them; None before."""
        return self._events_topic

    def _store_events_topic(self, value: str) -> None:
        """Keep ``value`` for `_stored_events_topic`."""
        self._events_topic = value

    _events_topic: str | None = None  # an in-process store's; Redis keeps it in a key

    @abstractmethod
    def update(self, arrivals: Sequence[Arrival], meanwhile: Callable[[], None] | None = None) -> StoreUpdate:
        """Judge each arrival by its id, append the accepted ones, and read the histories asked for.

        ``meanwhile`` is work the caller overlaps with the store's (the next batch's parsing):
        run once, while the store is busy with the request, or first. The update is in the store
        once the last answer is read (see `StoreUpdate`).

        A history holds the latest ``length`` behaviours strictly earlier than that event's
        ``ts``, oldest first: the point-in-time view a training sample may see. The first
        time an item is seen is kept: the earliest of its events, whatever their order; every
        arrival counts, duplicates and reused ids too (an item that was seen was seen, and
        the store learns it without waiting for the verdicts).

        Raises:
            TypeError: ``arrivals`` is not a sequence of `Arrival` (an `Event` is wrapped as
                ``Arrival(event, origin)``); nothing of the batch is stored.
        """

    @abstractmethod
    def sequence(self, user_id: str) -> list[Behaviour]:
        """The user's latest ``length`` behaviours, oldest first."""

    def close(self) -> None:
        """Release what the store holds (nothing, in process); safe to call more than once."""
