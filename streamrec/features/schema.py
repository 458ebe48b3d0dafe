"""The declared feature schema: what each event field means to the model, and how it may change.

A feature has a name, the event field it is read from, a kind and a role:

- kind ``id`` (one categorical id), ``ids`` (several, such as genres or tags, at most
  ``max_ids``) or ``number`` (a float, with a declared ``transform``);
- role ``behaviour`` (a property of what the user acted on: stored with every behaviour of the
  user's sequence, embedded for the target and along the sequence; or, with ``outcome``, how
  the behaviour went, such as a rating: along the sequence only), ``user`` (a property of
  the user: its latest value as of a sample's time is joined into the sample) or ``context``
  (a property of the moment, from the event itself; at serving time, from the request).

``item`` and ``category`` are the two features of the default schema (from the event
contract's ``item_id`` and ``category_id``); a deployment declares more in
``STREAMREC_FEATURES`` (a JSON list) or ``[[features]]`` tables in ``streamrec.toml``.

The schema is recorded, as `FeatureSchema.to_json`, where its meaning matters later (sample
batches, snapshots, exports). `FeatureSchema.check_evolution` decides whether a recorded
schema may be read under a new one: a feature may be added (old records read its default),
while a feature removed or redeclared is refused in one line saying what to do.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

from streamrec.errors import InvalidEvent, SchemaChange

Kind = Literal["id", "ids", "number"]
Role = Literal["behaviour", "user", "context"]
Transform = Literal["identity", "log1p", "standardize", "bucket"]
#: A feature's value: an ``id`` is a string, ``ids`` a tuple of strings, a ``number`` a float.
Value = str | tuple[str, ...] | float
#: The Python types `read_value` gives each kind's values (a number read from JSON may stay an int).
KIND_TYPES: dict[str, frozenset[type]] = {
    "id": frozenset({str}), "ids": frozenset({tuple}), "number": frozenset({float, int}),
}


def kind_of(value: Value) -> Kind:
    """The kind whose values ``value`` is of, by its type (`KIND_TYPES`).

    >>> kind_of(("i1", "i2")), kind_of("i1"), kind_of(3.0)
    ('ids', 'id', 'number')
    """
    return "ids" if isinstance(value, tuple) else "id" if isinstance(value, str) else "number"

MAX_ID_LENGTH = 128  # as the event contract's ids
# The largest float32: the learner holds numbers in float32 columns, where a larger finite
# JSON number (1e300) is inf, and one made its whole micro-batch's step non-finite.
MAX_NUMBER = 3.4028234663852886e38
# The event contract's own fields: a declared feature may read item_id or category_id (the
# defaults do), but never the fields that say who, when and which event.
RESERVED_FIELDS = frozenset({"event_id", "user_id", "action", "ts", "label"})
# The user id's name as a table's feature (streamrec.config.model.USER_FEATURE): a declared
# feature of that name would be a second model input of the same key.
RESERVED_NAMES = frozenset({"user"})
_NAME = r"^[a-z][a-z0-9_]{0,62}$"


class FeatureSpec(BaseModel):
    """One declared feature.

    Examples:
        >>> FeatureSpec(name="genres", kind="ids", max_ids=6).source
        'genres'
        >>> FeatureSpec(name="price", kind="number", transform="log1p", field="price_cents").source
        'price_cents'
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = Field(pattern=_NAME)
    # The event field it is read from; default: the feature's name.
    field: str | None = Field(None, min_length=1, max_length=128)
    kind: Kind = "id"
    role: Role = "behaviour"
    # A required feature missing from an event dead-letters it; an optional one reads its
    # table's default row (an id) or 0.0 after the transform (a number).
    required: bool = False
    # ``ids`` only: the most ids one value may hold (more dead-letters the event, naming it).
    max_ids: int = Field(8, ge=1, le=256)
    # ``number`` only: log1p (non-negative counts, prices), standardize (online mean and
    # variance, kept in the learner's state), bucket (into ids by ``boundaries``).
    transform: Transform = "identity"
    boundaries: tuple[float, ...] = ()
    # ``behaviour`` only: an outcome of the behaviour (a rating, a dwell time), not a property
    # of what was acted on. It is stored along the history, where it tells the user's taste,
    # but never read for a target: a target's own outcome is its label.
    outcome: bool = False

    @property
    def source(self) -> str:
        """The event field the feature is read from."""
        return self.field or self.name

    @model_validator(mode="after")
    def _consistent(self) -> FeatureSpec:
        if self.name in RESERVED_NAMES:
            raise ValueError(f"feature {self.name!r}: the name is the user id's (a table's feature); "
                             "name it otherwise")
        if self.source in RESERVED_FIELDS:
            raise ValueError(f"feature {self.name!r} cannot read the event contract's field {self.source!r}")
        if self.outcome and self.role != "behaviour":
            raise ValueError(f"feature {self.name!r}: only a behaviour feature can be an outcome")
        if self.kind != "number" and (self.transform != "identity" or self.boundaries):
            raise ValueError(f"feature {self.name!r}: a transform is for kind 'number' only")
        if self.transform == "bucket":
            if not self.boundaries or list(self.boundaries) != sorted(set(self.boundaries)):
                raise ValueError(f"feature {self.name!r}: bucket needs strictly increasing boundaries")
            if not all(math.isfinite(b) for b in self.boundaries):
                raise ValueError(f"feature {self.name!r}: boundaries must be finite")
        elif self.boundaries:
            raise ValueError(f"feature {self.name!r}: boundaries are for transform 'bucket' only")
        return self

    def meaning(self) -> dict[str, Any]:
        """What the feature means, as recorded: every setting, defaults included."""
        return self.model_dump(mode="json")


#: The default schema: the event contract's item and category, properties of what was acted on.
ITEM = FeatureSpec(name="item", field="item_id", kind="id", role="behaviour", required=True)
CATEGORY = FeatureSpec(name="category", field="category_id", kind="id", role="behaviour", required=True)
BUILTIN: tuple[FeatureSpec, ...] = (ITEM, CATEGORY)


class FeatureSchema:
    """The features of a deployment, in declared order: the built-ins, then the declared ones.

    Examples:
        >>> schema = FeatureSchema.of([FeatureSpec(name="genres", kind="ids")])
        >>> schema.names
        ('item', 'category', 'genres')
        >>> [f.name for f in schema.extras]
        ['genres']
        >>> FeatureSchema.from_json(schema.to_json()) == schema
        True
        >>> FeatureSchema.of([]).fingerprint == FeatureSchema.default().fingerprint
        True
    """

    __slots__ = ("_by_name", "features")

    def __init__(self, features: Iterable[FeatureSpec]) -> None:
        """A schema of ``features``.

        Raises:
            ValueError: two features share a name or an event field (a settings error when
                read from the configuration).
        """
        self.features: tuple[FeatureSpec, ...] = tuple(features)
        self._by_name = {f.name: f for f in self.features}
        names = [f.name for f in self.features]
        if len(self._by_name) != len(names):
            raise ValueError(f"two features share the name {_twice(names)!r}: give each its own; {_BUILT_IN}")
        sources = [f.source for f in self.features]
        if len(set(sources)) != len(sources):
            twice = _twice(sources)
            raise ValueError(f"two features read the event field {twice!r}: give each its own; {_BUILT_IN}")

    @classmethod
    def of(cls, declared: Iterable[FeatureSpec]) -> FeatureSchema:
        """The built-ins followed by ``declared`` (a deployment's ``STREAMREC_FEATURES``)."""
        return cls((*BUILTIN, *declared))

    @classmethod
    def default(cls) -> FeatureSchema:
        """The default schema: item and category only."""
        return cls(BUILTIN)

    @property
    def names(self) -> tuple[str, ...]:
        """Every feature's name, in order."""
        return tuple(self._by_name)

    @property
    def extras(self) -> tuple[FeatureSpec, ...]:
        """The declared features beyond the built-ins (what events carry in ``features``)."""
        return tuple(f for f in self.features if f not in BUILTIN)

    def role(self, role: Role) -> tuple[FeatureSpec, ...]:
        """The features of one role, in order."""
        return tuple(f for f in self.features if f.role == role)

    def __getitem__(self, name: str) -> FeatureSpec:
        """The feature called ``name``."""
        return self._by_name[name]

    def __contains__(self, name: object) -> bool:
        """Whether a feature is called ``name``."""
        return name in self._by_name

    def __eq__(self, other: object) -> bool:
        """Same features, same meanings, same order."""
        return isinstance(other, FeatureSchema) and self.features == other.features

    def __hash__(self) -> int:
        """By its features."""
        return hash(self.features)

    def __repr__(self) -> str:
        """The names."""
        return f"FeatureSchema({', '.join(self.names)})"

    def to_json(self) -> list[dict[str, Any]]:
        """The recorded form: each feature's full meaning, in order."""
        return [f.meaning() for f in self.features]

    @classmethod
    def from_json(cls, doc: list[dict[str, Any]] | None) -> FeatureSchema:
        """Inverse of `to_json`; ``None`` (a record from before schemas) is the default schema."""
        if doc is None:
            return cls.default()
        return cls(FeatureSpec.model_validate(f) for f in doc)

    @property
    def fingerprint(self) -> str:
        """12 hex digits of the recorded form's sha256: equal schemas, equal fingerprints."""
        return hashlib.sha256(orjson.dumps(self.to_json(), option=orjson.OPT_SORT_KEYS)).hexdigest()[:12]

    def check_evolution(self, recorded: FeatureSchema, what: str) -> tuple[str, ...]:
        """Whether ``what`` (a snapshot, a sample, an export), recorded under ``recorded``, reads under this.

        Returns:
            The names of the features added since (they read their default in old records;
            a new table starts fresh).

        Raises:
            SchemaChange: a recorded feature is gone or means something else now; the line
                says which and what to do.
        """
        for old in recorded.features:
            new = self._by_name.get(old.name)
            if new is None:
                raise SchemaChange(
                    f"{what} was written with feature {old.name!r}, which is no longer declared: "
                    f"declare it again (STREAMREC_FEATURES), or start from a fresh snapshot directory "
                    f"and samples topic"
                )
            if new != old:
                changed = sorted(k for k, v in old.meaning().items() if new.meaning()[k] != v)
                raise SchemaChange(
                    f"{what} was written with feature {old.name!r} declared otherwise ({', '.join(changed)} "
                    f"changed): declare it as before, or declare the new meaning under a new name"
                )
        return tuple(n for n in self.names if n not in recorded)


def read_features(doc: Mapping[str, Any], specs: Iterable[FeatureSpec]) -> dict[str, Value]:
    """The values of ``specs`` in one event's JSON object, by feature name, checked.

    A missing or null optional feature is left out (it reads its default downstream).

    Raises:
        InvalidEvent: a value breaks its declaration; the reason names the feature.

    Examples:
        >>> specs = [FeatureSpec(name="genres", kind="ids", max_ids=2),
        ...          FeatureSpec(name="price", kind="number")]
        >>> read_features({"genres": ["a", 7], "price": 3}, specs)
        {'genres': ('a', '7'), 'price': 3.0}
        >>> read_features({"genres": ["a", "b", "c"]}, specs)
        Traceback (most recent call last):
        ...
        streamrec.errors.InvalidEvent: feature 'genres' (field 'genres') has 3 ids, over its max_ids of 2
    """
    values: dict[str, Value] = {}
    for spec in specs:
        raw = doc.get(spec.source)
        if raw is None:
            if spec.required:
                raise InvalidEvent(f"feature {spec.name!r} is required: field {spec.source!r} is missing")
            continue
        values[spec.name] = read_value(spec, raw)
    return values


def read_value(spec: FeatureSpec, raw: object) -> Value:
    """One value of ``spec``, checked (see `read_features`).

    Raises:
        InvalidEvent: naming the feature and what is wrong.
    """
    # the common valid values first, without the reason's text: a consumer reads every
    # declared value of every event (four a record cost ~30,000 instructions more with it,
    # bench/consumer_instructions.py --features 4)
    kind = spec.kind
    if kind == "id":
        if type(raw) is str and 0 < len(raw) <= MAX_ID_LENGTH and raw.isprintable():
            return raw
    elif kind == "ids":
        if type(raw) is list and len(raw) <= spec.max_ids and all(
            type(v) is str and 0 < len(v) <= MAX_ID_LENGTH and v.isprintable() for v in raw
        ):
            return tuple(raw)
    elif (type(raw) is float or type(raw) is int) and -MAX_NUMBER <= raw <= MAX_NUMBER:
        number = float(raw)
        if number > -1.0 or spec.transform != "log1p":
            return number
    return _checked_value(spec, raw)


def _checked_value(spec: FeatureSpec, raw: object) -> Value:
    """`read_value` for what its common cases leave: the value checked in full, or the reason."""
    where = f"feature {spec.name!r} (field {spec.source!r})"
    if spec.kind == "id":
        return _id(raw, where)
    if spec.kind == "ids":
        if not isinstance(raw, list | tuple):
            raise InvalidEvent(f"{where} must be a list of ids, got {type(raw).__name__}")
        if len(raw) > spec.max_ids:
            raise InvalidEvent(f"{where} has {len(raw)} ids, over its max_ids of {spec.max_ids}")
        return tuple(_id(v, where) for v in raw)
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise InvalidEvent(f"{where} must be a number, got {type(raw).__name__}")
    if isinstance(raw, float) and not math.isfinite(raw):
        raise InvalidEvent(f"{where} must be a finite number, got {raw!r}")
    if abs(raw) > MAX_NUMBER:  # an int too: float() of 10**400 raises OverflowError
        shown = f"{raw:.4g}" if isinstance(raw, float) else f"an integer of {raw.bit_length()} bits"
        raise InvalidEvent(f"{where} must be within float32's range (±{MAX_NUMBER:.4g}), got {shown}")
    number = float(raw)
    if spec.transform == "log1p" and number <= -1.0:
        raise InvalidEvent(f"{where} is log1p-transformed and must be above -1, got {raw!r}")
    return number


def _id(raw: object, where: str) -> str:
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        raise InvalidEvent(f"{where} must hold string or integer ids, got {type(raw).__name__}")
    text = str(raw)
    if not text or len(text) > MAX_ID_LENGTH:
        raise InvalidEvent(f"{where} ids must have 1..{MAX_ID_LENGTH} characters")
    if not text.isprintable():
        raise InvalidEvent(unprintable(where, text))
    return text


_BUILT_IN = "item and category, of the fields item_id and category_id, are built in"


def _twice(values: list[str]) -> str:
    """The first of ``values`` that comes twice."""
    return next(v for k, v in enumerate(values) if v in values[:k])


def unprintable(what: str, text: str) -> str:
    """Why ``text`` (``what``) is refused: its first character that `str.isprintable` refuses.

    Examples:
        >>> unprintable("field 'item_id'", "a\u00a0b")
        "field 'item_id' contains U+00A0, which is not printable (a control, format or separator)"
    """
    char = next(c for c in text if not c.isprintable())
    return f"{what} contains U+{ord(char):04X}, which is not printable (a control, format or separator)"
