"""Declared features at serving time: where each of a request's comes from.

A model trained with declared features (``STREAMREC_FEATURES``) reads, for a request:

- the user's history with its behaviour features (outcomes included) along it, from the
  feature store, as the consumers stored them (`store_history`);
- the user's features, each its newest value in the profile store (`store_history` with a
  profile store);
- each candidate's own behaviour features (not outcomes: a candidate has none yet), from the
  request (`Candidate.features`: the request's candidates are defined here);
- or, when the request brings its own history, the behaviour features along it (outcomes
  included) from the request's history entries and the user's from its ``user_features``
  (`GivenHistory`): a request that replaces the stores' read gives what they would;
- the context features, from the request.

Whatever is absent reads its default (a table's default row, 0.0 for a number), as in
training. `StoredHistory` carries what the stores hold of a user: a list of (item, category)
pairs, oldest first, so every caller that reads a history as pairs reads it as before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, overload

import numpy as np

from streamrec.errors import InvalidEvent
from streamrec.events import MIN_TS_MS
from streamrec.features import FeatureSchema, read_value
from streamrec.features.schema import Value
from streamrec.learner.columns import SampleColumns
from streamrec.samples import BUILTIN_FIELDS, Sample
from streamrec.serving.contract import feature_batch_inputs

if TYPE_CHECKING:
    from streamrec.config import StreamrecConfig
    from streamrec.featurestore import FeatureStore
    from streamrec.featurestore.profiles import Profile, ProfileStore

Along = Mapping[str, tuple[Value | None, ...]]
#: The default schema's features, in the order a history's pairs hold them: (item, category).
PAIR: tuple[str, ...] = tuple(BUILTIN_FIELDS)


@dataclass(frozen=True)
class Candidate:
    """An item to score; without a category it reads the category table's default row.

    ``features`` holds its own declared behaviour features (``genres``, say), raw values by
    feature name, checked when scored; one absent reads its default.
    """

    item_id: str
    category_id: str | None = None
    features: Mapping[str, object] = field(default_factory=dict, hash=False)

    def target_id(self, feature: str) -> str | None:
        """Its id of one of the default schema's features, by name (``item``, ``category``)."""
        value: str | None = getattr(self, BUILTIN_FIELDS[feature][0])
        return value

    @classmethod
    def parse(cls, text: str) -> Candidate:
        """``item`` or ``item:category``."""
        item, _, category = text.partition(":")
        return cls(item, category or None)


class Candidates(Sequence[Candidate]):
    """A request's candidates as two columns: item ids and categories, none with features of its own.

    What a request of the common form is read as (`streamrec.serving.requests`): the scorer
    reads the columns whole (`candidate_columns`), and a `Candidate` is made only when one is
    asked for, so 100 candidates cost two lists instead of 100 objects.
    """

    def __init__(self, item_ids: list[str], category_ids: list[str | None]) -> None:
        """The candidates ``zip(item_ids, category_ids)``."""
        if len(item_ids) != len(category_ids):
            raise ValueError(f"{len(category_ids)} categories for {len(item_ids)} items")
        self.item_ids = item_ids
        self.category_ids = category_ids

    def __len__(self) -> int:
        """How many candidates."""
        return len(self.item_ids)

    @overload
    def __getitem__(self, index: int) -> Candidate: ...

    @overload
    def __getitem__(self, index: slice) -> list[Candidate]: ...

    def __getitem__(self, index: int | slice) -> Candidate | list[Candidate]:
        """The candidate at ``index``, or a list of those in a slice."""
        if isinstance(index, slice):
            pairs = zip(self.item_ids[index], self.category_ids[index], strict=True)
            return [Candidate(item, category) for item, category in pairs]
        return Candidate(self.item_ids[index], self.category_ids[index])


def candidate_columns(candidates: Sequence[Candidate]) -> dict[str, Sequence[str | None]]:
    """The ids of ``candidates`` of each of the default schema's features (`PAIR`), by name.

    Raises:
        TypeError: a candidate is not a `Candidate` (an item id, say), or its ids are not strings.
    """
    if isinstance(candidates, Candidates):
        return dict(zip(PAIR, (candidates.item_ids, candidates.category_ids), strict=True))
    if (odd := next((c for c in candidates if not _of_str_ids(c)), None)) is not None:
        if not isinstance(odd, Candidate):
            raise TypeError(f"candidates are Candidate values (Candidate(item_id, category_id)), not {odd!r}")
        item_wrong = not isinstance(odd.item_id, str)
        name, kind = ("item_id", "a str") if item_wrong else ("category_id", "a str or None")
        wrong = getattr(odd, name)
        raise TypeError(f"a candidate's {name} is {kind}, not {wrong!r} ({type(wrong).__name__})")
    return {name: [c.target_id(name) for c in candidates] for name in PAIR}


def _of_str_ids(candidate: object) -> bool:
    """Whether ``candidate`` is a `Candidate` of str ids (its category may be None): one test a candidate."""
    return (
        isinstance(candidate, Candidate)
        and isinstance(candidate.item_id, str)
        and isinstance(candidate.category_id, str | None)
    )


class StoredHistory(list[tuple[str, str]]):
    """A user's behaviours as the stores hold them: (item, category) pairs, oldest first.

    ``features`` holds each declared behaviour feature along them, by name (None where a
    behaviour has no value), ``user_features`` the user's declared user features, each its
    newest value.
    """

    def __init__(
        self,
        pairs: Sequence[tuple[str, str]],
        features: Along | None = None,
        user_features: Mapping[str, Value] | None = None,
    ) -> None:
        """The history of ``pairs`` with its features."""
        super().__init__(pairs)
        self.features: Along = features or {}
        self.user_features: Mapping[str, Value] = user_features or {}


class GivenHistory(list[tuple[str, str]]):
    """A request's own history: (item, category) pairs, oldest first, with each behaviour's features.

    ``given`` holds, for each behaviour, its raw declared behaviour features by name (outcomes
    included), as the request gave them, and ``user_features`` the user's raw declared user
    features (what the profile store gives beside a stored history): both checked when scored,
    as a candidate's, against the schema of the version that scores it.
    """

    def __init__(
        self,
        pairs: Sequence[tuple[str, str]],
        given: Sequence[Mapping[str, object]],
        user_features: Mapping[str, object] | None = None,
    ) -> None:
        """The history of ``pairs`` with ``given`` features, one mapping per pair."""
        super().__init__(pairs)
        if len(given) != len(pairs):
            raise ValueError(f"{len(given)} behaviours' features for {len(pairs)} behaviours")
        self.given: tuple[Mapping[str, object], ...] = tuple(given)
        self.user_features: Mapping[str, object] = user_features or {}


def newest_values(profile: Profile) -> dict[str, Value]:
    """Each user feature's newest value: the user as of now."""
    return {name: points[-1][1] for name, points in profile.items() if points}


def store_history(
    store: FeatureStore, profiles: ProfileStore | None = None
) -> Callable[[str], list[tuple[str, str]]]:
    """``history_of`` from the feature store: the user's latest behaviours, oldest first.

    With declared behaviour features the history carries them (a `StoredHistory`); with a
    ``profiles`` store, the user's features too (one more read).
    """
    specs = store.behaviour_features
    if not specs and profiles is None:

        def pairs_of(user: str) -> list[tuple[str, str]]:
            return [(b.item_id, b.category_id) for b in store.sequence(user)]

        return pairs_of

    def history_of(user: str) -> list[tuple[str, str]]:
        behaviours = store.sequence(user)
        rows = [b.values(specs) for b in behaviours]
        along = {s.name: tuple(row[k] for row in rows) for k, s in enumerate(specs)} if rows else {}
        users = newest_values(profiles.profile(user)) if profiles is not None else {}
        return StoredHistory([(b.item_id, b.category_id) for b in behaviours], along, users)

    return history_of


def feature_request_inputs(
    contract: Mapping[str, object],
    user_id: str,
    candidates: Sequence[Candidate],
    context: Mapping[str, object] | None,
    history: Sequence[tuple[str, str]] = (),
) -> dict[str, np.ndarray]:
    """The declared features' inputs of a request (none without), by ``<feature>/<side>``.

    ``context``, each candidate's ``features`` and a `GivenHistory`'s features (along it and
    the user's) are the request's raw values, by feature name, checked as an event's (other
    names are ignored); a `StoredHistory` gives the features along the history and the user's.
    Every other declared feature reads absent.

    Raises:
        InvalidEvent: a request value breaks its declaration (the reason names the feature).
    """
    doc = contract.get("feature_schema")
    if not doc:
        return {}
    schema = FeatureSchema.from_json(doc)  # type: ignore[arg-type]  # the contract's JSON list
    features = _given(schema, context or {}, ("context",))
    _require(schema, candidates, features)
    along: dict[str, tuple[Value | None, ...]] = {}
    if isinstance(history, StoredHistory):
        features |= {k: v for k, v in history.user_features.items() if _role(schema, k) == "user"}
        along = {
            k: v for k, v in history.features.items()
            if _role(schema, k) == "behaviour" and any(x is not None for x in v)
        }
    elif isinstance(history, GivenHistory):
        features |= _given(schema, history.user_features, ("user",))
        along = _along(schema, history.given)
    items = tuple(item for item, _ in history)
    categories = tuple(category for _, category in history)
    samples = [
        Sample(
            "request", user_id, MIN_TS_MS, c.item_id, c.category_id or "-", 0, items, categories,
            features={**features, **_given(schema, c.features, ("behaviour",), targets=True)},
            seq_features=along,
        )
        for c in candidates
    ]
    return feature_batch_inputs(contract, SampleColumns.from_samples(samples))


def _require(schema: FeatureSchema, candidates: Sequence[Candidate], context: Mapping[str, Value]) -> None:
    """Refuse a request without a required feature it is the only source of (as an event without one).

    Raises:
        InvalidEvent: naming the feature and where to give it.
    """
    for spec in schema.extras:
        if not spec.required or spec.outcome:
            continue
        if spec.role == "context" and spec.name not in context:
            raise InvalidEvent(f"feature {spec.name!r} is required: give it in the request's 'context'")
        if spec.role == "behaviour":
            bare = next((c for c in candidates if c.features.get(spec.name) is None), None)
            if bare is not None:
                raise InvalidEvent(
                    f"feature {spec.name!r} is required: give it with each item ({bare.item_id} has none)"
                )


def _role(schema: FeatureSchema, name: str) -> str | None:
    return schema[name].role if name in schema else None


def _along(
    schema: FeatureSchema, given: Sequence[Mapping[str, object]]
) -> dict[str, tuple[Value | None, ...]]:
    """The behaviour features (outcomes included) along a request's history, checked (None: absent)."""
    rows = [_given(schema, raw, ("behaviour",)) for raw in given]
    names = [name for name in schema.names if any(name in row for row in rows)]
    return {name: tuple(row.get(name) for row in rows) for name in names}


def _given(
    schema: FeatureSchema, raw: Mapping[str, object], roles: tuple[str, ...], targets: bool = False
) -> dict[str, Value]:
    """The declared values of ``roles`` in ``raw``, checked; with ``targets``, no outcomes."""
    out = {}
    for name, value in raw.items():
        if value is None or name not in schema or name in BUILTIN_FIELDS:  # the contract's own
            continue
        spec = schema[name]
        if spec.role in roles and not (targets and spec.outcome):
            out[name] = read_value(spec, value)
    return out


def history_source(cfg: StreamrecConfig, use_store: bool) -> Callable[[str], Sequence[tuple[str, str]]]:
    """Users' sequences from the configured feature store, or none (every user new).

    With the declared behaviour features along them and, when user features are declared,
    the user's newest values from the profile store.
    """
    from streamrec.featurestore import make_feature_store, make_profile_store

    if not use_store:
        return no_history
    store = make_feature_store(cfg)
    profiles = make_profile_store(cfg) if cfg.feature_schema().role("user") else None
    return store_history(store, profiles)


def no_history(user: str) -> list[tuple[str, str]]:
    """``history_of`` without a feature store: every user is new."""
    return []
