r"""A behaviour's declared feature values as its sequence entry carries them.

A sequence entry (`streamrec.featurestore.base.Behaviour.member`) is ``event_id \t item \t
category \t action``; a deployment that declares behaviour features (``STREAMREC_FEATURES``,
role ``behaviour``, outcomes included) appends their values to the action, in schema order,
each after a group separator (``\x1d``): an id as it is, ids joined by record separators
(``\x1e``; no ids at all, one ``\x1e``), a number as its shortest repr (``3`` for 3.0), a
missing value as nothing. Ids are printable (the event contract, `read_value`), so neither
separator can occur inside one, nor a tab, so the entry keeps its four tab-separated fields
and the store's scripts and answer parsing stay as they are. The default schema's entries
are exactly as before.

Values are positional: a feature added to the end of the declared list reads None in the
entries stored before it (its default); one declared in the middle would misread them, so the
Redis store refuses, as it attaches, a list that does not extend the one its entries were
written with, or a stored feature declared as another kind (`RedisFeatureStore.attach`).

Examples:
    >>> from streamrec.features.schema import FeatureSpec
    >>> specs = (FeatureSpec(name="tags", kind="ids"), FeatureSpec(name="price", kind="number"),
    ...          FeatureSpec(name="shop"))
    >>> text = encode({"tags": ("a", "b"), "price": 3.0}, specs)
    >>> text
    '\x1da\x1eb\x1d3\x1d'
    >>> decode(text, specs)
    (('a', 'b'), 3.0, None)
    >>> decode("", specs)  # an entry stored before the features were declared
    (None, None, None)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from streamrec.features.schema import FeatureSpec, Value

GROUP = "\x1d"  # before each value
RECORD = "\x1e"  # between the ids of one value


def encode(features: Mapping[str, Value], specs: Sequence[FeatureSpec]) -> str:
    """The values of ``specs`` in ``features`` as appended to an entry's action."""
    return "".join([GROUP + _text(features.get(spec.name)) for spec in specs])


def _text(value: Value | None) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, tuple):
        return RECORD.join(value) if value else RECORD
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def split(action: str) -> tuple[str, str]:
    """An entry's action field as the action and its encoded values (``""`` when none)."""
    at = action.find(GROUP)
    return (action, "") if at < 0 else (action[:at], action[at:])


def decode(text: str, specs: Sequence[FeatureSpec]) -> tuple[Value | None, ...]:
    """The values of ``specs`` in ``text`` (`encode`'s), None where missing or never stored."""
    parts = text.split(GROUP)[1:] if text else []
    return tuple(_value(spec, parts[k]) if k < len(parts) else None for k, spec in enumerate(specs))


def _value(spec: FeatureSpec, text: str) -> Value | None:
    if not text:
        return None
    if spec.kind == "id":
        return text
    if spec.kind == "ids":
        return () if text == RECORD else tuple(text.split(RECORD))
    return float(text)


def columns(
    actions: Sequence[str], specs: Sequence[FeatureSpec]
) -> dict[str, tuple[Value | None, ...]]:
    """Each feature of ``specs`` along a history, by name, from its entries' action fields."""
    rows = [decode(split(action)[1], specs) for action in actions]
    return {spec.name: tuple([row[k] for row in rows]) for k, spec in enumerate(specs)}
