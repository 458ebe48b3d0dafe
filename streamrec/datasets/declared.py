"""Declared features on recorded and generated events: a schema's extras, read from an event's fields.

A dataset reader (or the generator) knows more about an event than the contract's fields: a
MovieLens rating has the movie's genres and year and the rating itself. It hands those on as
*fields*, the top-level fields the event's JSON would carry on the events topic
(``{"genres": ["Drama"], "year": 1995, "rating": 4.0}``), and `declare` keeps what the
deployment's schema declares, read and checked as the consumers read them
(`streamrec.features.read_features`): a field the schema does not declare is dropped, as a
consumer ignores an unknown field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec
import orjson

from streamrec.errors import DatasetError, InvalidEvent
from streamrec.events import Event
from streamrec.features import FeatureSpec, Value, read_features


def declare(event: Event, fields: Mapping[str, object], specs: Sequence[FeatureSpec], source: str) -> Event:
    """``event`` with the values of ``specs`` read from ``fields``.

    Args:
        event: The contract event.
        fields: The event's other top-level fields, by field name.
        specs: The declared features to read (a schema's ``extras``); none: ``event`` as it is.
        source: Where the event was read (a path), for the error.

    Raises:
        DatasetError: a field breaks its declaration (naming the source, the event and the
            feature).
    """
    if not specs:
        return event
    try:
        values = read_features(fields, specs)
    except InvalidEvent as exc:
        raise DatasetError(f"{source}: event {event.event_id}: {exc}") from exc
    return with_features(event, values)


def with_features(event: Event, values: Mapping[str, Value]) -> Event:
    """``event`` carrying ``values`` (declared extras, by feature name) in ``Event.features``."""
    if not values:
        return event
    return msgspec.structs.replace(event, features=dict(values))


def wire(event: Event, fields: Mapping[str, object]) -> bytes:
    """The event as the events topic carries it: the contract's fields, ``fields`` beside them.

    Examples:
        >>> wire(Event("e1", "u1", "i1", "c1", "pv", 1_700_000_000_000), {"device": "ios"})
        b'{"event_id":"e1",...,"ts":1700000000000,"device":"ios"}'
    """
    raw = event.to_json()
    if not fields:
        return raw
    return orjson.dumps({**orjson.loads(raw), **fields})
