"""The event contract: one click/behaviour event, its JSON wire form and its validation.

Wire form: a JSON object on topic ``streamrec.events``, key = ``user_id``::

    {"event_id": "e-1", "user_id": "42", "item_id": "1001", "category_id": "7",
     "action": "pv", "ts": 1511658000000, "label": 1}

``label`` is optional: present for explicit feedback (1 positive, 0 negative), absent for
implicit behaviour. Ids may be strings or integers of any size and are carried as strings;
``action`` is a string. Unknown fields are ignored, so producers can add context without
breaking older consumers.
"""

from __future__ import annotations

import json
import math
import types
import zlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any

import msgspec
import orjson

from streamrec.errors import InvalidEvent
from streamrec.features.schema import Value, read_features, unprintable
from streamrec.jsonerrors import json_error

if TYPE_CHECKING:
    from streamrec.features.schema import FeatureSchema, FeatureSpec

MAX_ID_LENGTH = 128  # ids longer than this are almost surely a producer bug, not an id
# Epoch-ms below 1e11 (March 1973) means seconds were sent: seconds stay below 1e11 until
# the year 5138, while every real millisecond time since 1973 is above it.
MIN_TS_MS = 100_000_000_000
# 9999-12-31T23:59:59.999Z: the last millisecond a calendar date can show, far inside int64
# (so a batch's int64 ts column cannot overflow), and no real event time is later. Where no
# clock bounds an event (a replayed file), it is what refuses micro- and nanoseconds: any such
# stamp since 1978 is past it.
MAX_TS_MS = 253_402_300_799_999
_IDS = ("event_id", "user_id", "item_id", "category_id")
_REQUIRED = (*_IDS, "action", "ts")


_Id = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_LENGTH)]
#: The features of an event of the default schema: one shared, read-only empty mapping, so
#: decoding an event makes no dict for them.
NO_FEATURES: Mapping[str, Value] = types.MappingProxyType({})
# Event.features's name to the struct's decoder: a name no producer writes, so the C decoder
# does not fill it from the wire (declared features are top-level fields, read by
# `parse_event`, which replaces it; not checked without them: a check an event costs).
_FEATURES_WIRE_NAME = "\u00a7features"


class Event(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    """One user behaviour at event time ``ts`` (epoch milliseconds).

    A frozen msgspec struct: the consumers make one for every record, decoded and checked
    straight from its JSON (`parse_event`, ~1 us against ~4 us for a parse and checks
    in Python), and one is made about three times as fast as a named tuple. The annotations'
    limits hold for decoded events only; an event made in code is not checked. Untracked by
    the garbage collector (``gc=False``): it holds strings and numbers only, so it is never
    part of a reference cycle, and a batch's thousands of events cost the collector nothing.

    Examples:
        >>> event = Event("e1", "u1", "i1", "c1", "click", ts=1_700_000_000_000)
        >>> event.to_json()
        b'{"event_id":"e1","user_id":"u1",...,"action":"click","ts":1700000000000}'
        >>> event.fingerprint() == Event("e2", "u1", "i1", "c1", "click", 1_700_000_000_000).fingerprint()
        True
    """

    event_id: _Id
    user_id: _Id
    item_id: _Id
    category_id: _Id
    action: _Id
    ts: Annotated[int, msgspec.Meta(ge=MIN_TS_MS, le=MAX_TS_MS)]
    label: int | None = None
    # The declared features beyond item and category (`streamrec.features`), by feature name:
    # read from the event's top-level fields by `parse_event` when a schema declares them.
    features: Mapping[str, Value] = msgspec.field(default=NO_FEATURES, name=_FEATURES_WIRE_NAME)

    def fingerprint(self) -> str:
        """A short digest of everything but the id.

        Tells a resent event (same content) from an id reused for another one. The declared
        features count when the event has any: an event of the default schema keeps the
        fingerprint it always had.
        """
        # the repr of the tuple (user, item, category, action, ts, label), written out: a
        # third faster than building the tuple, and the same text (stored marks depend on it)
        text = (
            f"({self.user_id!r}, {self.item_id!r}, {self.category_id!r}, {self.action!r}, "
            f"{self.ts!r}, {self.label!r})"
        )
        if self.features:  # in schema order, as `parse_event` reads them whatever the JSON's order
            text += repr(tuple(self.features.items()))
        # 8 hex digits, zero-padded: as f"{crc:08x}" writes them, which parses its format
        # spec every call (~2,000 instructions, a fifth of the fingerprint)
        return zlib.crc32(text.encode()).to_bytes(4).hex()

    def __hash__(self) -> int:
        """By the contract's fields: equal events have equal ones (the features, a mapping, do not hash)."""
        return hash((self.event_id, self.user_id, self.item_id, self.category_id, self.action, self.ts,
                     self.label))

    def to_json(self, schema: FeatureSchema | None = None) -> bytes:
        """Encode in the wire form (``label`` omitted when absent).

        The declared features are top-level fields: each at its feature's event field in
        ``schema``, at its name without one (or for a feature ``schema`` does not declare).

        Examples:
            >>> event = Event("e1", "u1", "i1", "c1", "click", 1_700_000_000_000, features={"genres": ("a",)})
            >>> event.to_json()
            b'{"event_id":"e1",...,"ts":1700000000000,"genres":["a"]}'
        """
        if not self.features:
            return _ENCODER.encode(self)
        head = _ENCODER.encode(msgspec.structs.replace(self, features=NO_FEATURES))
        fields = {_field(schema, name): value for name, value in self.features.items()}
        return head[:-1] + b"," + _ENCODER.encode(fields)[1:]


def _field(schema: FeatureSchema | None, name: str) -> str:
    return schema[name].source if schema is not None and name in schema else name


_ENCODER = msgspec.json.Encoder()
# The contract's common case, decoded and checked in C: string ids of 1 to MAX_ID_LENGTH
# characters, an integer ``ts`` from MIN_TS_MS to MAX_TS_MS, an integer or no label. What it refuses
# (integer ids, a float ``ts``, a boolean label, any fault) the field-by-field checks
# take on, and explain when it is a fault.
_DECODER = msgspec.json.Decoder(Event)


def _id(doc: dict[str, Any], name: str) -> str:
    return as_id(doc[name], name)


def as_id(value: object, name: str) -> str:
    """An id as the contract carries it: a string, or an integer as its decimal string.

    Raises:
        InvalidEvent: naming the field (``name``) and what is wrong.

    Examples:
        >>> as_id(42, "user_id")
        '42'
        >>> as_id(4.2, "user_id")
        Traceback (most recent call last):
        ...
        streamrec.errors.InvalidEvent: field 'user_id' must be a string or integer, got float
    """
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise InvalidEvent(f"field {name!r} must be a string or integer, got {type(value).__name__}")
    return _text(name, str(value))


def _action(doc: dict[str, Any]) -> str:
    # a string, as the contract says: the consumers match it against string settings
    # (STREAMREC_CONSUMER__POSITIVE_ACTIONS, IMPRESSION_ACTION), which an integer never equals
    value = doc["action"]
    if not isinstance(value, str):
        raise InvalidEvent(f"field 'action' must be a string (the contract's), got {type(value).__name__}")
    return _text("action", value)


def _text(name: str, text: str) -> str:
    if not text or len(text) > MAX_ID_LENGTH:
        raise InvalidEvent(f"field {name!r} must have 1..{MAX_ID_LENGTH} characters")
    if not text.isprintable():
        raise InvalidEvent(unprintable(f"field {name!r}", text))
    return text


def _ts(doc: dict[str, Any], now_ms: int, max_future_ms: int) -> int:
    value = doc["ts"]
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidEvent(f"field 'ts' must be integer epoch milliseconds, got {value!r}")
    if value < MIN_TS_MS:
        raise InvalidEvent(f"field 'ts'={value} looks like seconds: send epoch milliseconds")
    if value > MAX_TS_MS:
        raise InvalidEvent(
            f"field 'ts'={value} is after the year 9999: send epoch milliseconds, not micro- or nanoseconds"
        )
    if value > now_ms + max_future_ms:
        raise InvalidEvent(f"field 'ts'={value} is {value - now_ms} ms in the future")
    return value


def _label(doc: dict[str, Any]) -> int | None:
    value = doc.get("label")
    if value is None:
        return None
    if isinstance(value, bool):
        return int(value)
    if value in (0, 1):
        return int(value)
    raise InvalidEvent(f"field 'label' must be 0 or 1, got {value!r}")


def parse_event(
    raw: bytes | None,
    *,
    now_ms: int,
    max_future_ms: int,
    max_bytes: int,
    extras: Sequence[FeatureSpec] = (),
) -> Event:
    """Decode and validate one wire record.

    Args:
        raw: The record's value (None: a null value).
        now_ms: The time now, epoch ms: events further than ``max_future_ms`` ahead of it are
            refused.
        max_future_ms: How far ahead of ``now_ms`` an event may be stamped.
        max_bytes: The largest record accepted.
        extras: The declared features beyond item and category (`FeatureSchema.extras`),
            read from the record's top-level fields into `Event.features`. None: the record
            is decoded and checked in C alone, as ever.

    Raises:
        InvalidEvent: The record breaks the event contract, or a declared feature its
            declaration; the message says how (naming the feature).

    Examples:
        >>> now = 1_700_000_000_000
        >>> raw = b'{"event_id":1,"user_id":2,"item_id":3,"category_id":4,"action":"click","ts":%d}' % now
        >>> event = parse_event(raw, now_ms=now, max_future_ms=0, max_bytes=1024)
        >>> event.user_id, event.item_id, event.ts
        ('2', '3', 1700000000000)
        >>> parse_event(raw.replace(b"000}", b"}"), now_ms=now, max_future_ms=0, max_bytes=1024)
        Traceback (most recent call last):
        ...
        streamrec.errors.InvalidEvent: field 'ts'=1700000000 looks like seconds: send epoch milliseconds
    """
    if raw is None:
        raise InvalidEvent("empty record (null value)")
    if len(raw) > max_bytes:
        raise InvalidEvent(f"record is {len(raw)} bytes, over the {max_bytes}-byte limit")
    try:
        event = _DECODER.decode(raw)
    except (msgspec.MsgspecError, RecursionError):  # nested deeper than it goes: orjson says so below
        pass
    else:
        label, ids = event.label, event.event_id + event.user_id + event.item_id + event.category_id
        if (
            event.ts <= now_ms + max_future_ms
            and (label is None or label == 0 or label == 1)
            and (ids + event.action).isprintable()
        ):
            if extras:  # the declared ones: they replace anything the wire name held
                return msgspec.structs.replace(event, features=_declared(_document(raw), extras))
            return event
    doc = _document(raw)
    event = _event_of(doc, raw, now_ms, max_future_ms)
    if extras:
        return msgspec.structs.replace(event, features=_declared(doc, extras))
    return event


def _declared(doc: dict[str, Any], extras: Sequence[FeatureSpec]) -> Mapping[str, Value]:
    """`read_features` of ``doc``, refused where absent ones are nested in a ``features`` object.

    ``Event(features=...)`` may suggest that shape to a producer of its own; its values would read
    their defaults, and nothing would say so.
    """
    values = read_features(doc, extras)
    nested = doc.get("features")
    if type(nested) is dict and len(values) < len(extras):
        inside = [s for s in extras if s.name not in values and s.source in nested]
        if inside:
            first = inside[0]
            more = f" (and {', '.join(repr(s.source) for s in inside[1:])})" if inside[1:] else ""
            raise InvalidEvent(
                f"feature {first.name!r} (field {first.source!r}) is inside the field 'features'{more}: "
                "declared features are top-level fields of the event, each at its field"
            )
    return values or NO_FEATURES


def _document(raw: bytes) -> dict[str, Any]:
    """The record's JSON object, or the reason it is none."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidEvent(f"not valid JSON: {json_error(exc)}") from exc
    if not isinstance(doc, dict):
        raise InvalidEvent(f"expected a JSON object, got {type(doc).__name__}")
    return doc


def _checked(raw: bytes, now_ms: int, max_future_ms: int) -> Event:
    """Check a record field by field.

    The event of a record the decoder refused that is valid after all (integer ids, a float
    ``ts`` that is a whole number, a boolean label), or the reason.
    """
    return _event_of(_document(raw), raw, now_ms, max_future_ms)


def _event_of(doc: dict[str, Any], raw: bytes, now_ms: int, max_future_ms: int) -> Event:
    """`_checked` on the record's object ``doc``, already read."""
    missing = [name for name in _REQUIRED if name not in doc]
    if missing:
        raise InvalidEvent(f"missing field(s): {', '.join(missing)}")
    if any(isinstance(doc[name], float) for name in _IDS):
        # orjson reads integers beyond 64 bits as floats; the standard parser keeps them
        # exact, so an id such as 2**70 is accepted while a real float is still refused.
        try:
            doc = json.loads(raw)
        except RecursionError:  # orjson reads 1,024 levels, the standard parser fewer
            raise InvalidEvent("not valid JSON: nested past the depth limit") from None
    return Event(
        event_id=_id(doc, "event_id"),
        user_id=_id(doc, "user_id"),
        item_id=_id(doc, "item_id"),
        category_id=_id(doc, "category_id"),
        action=_action(doc),
        ts=_ts(doc, now_ms, max_future_ms),
        label=_label(doc),
    )
