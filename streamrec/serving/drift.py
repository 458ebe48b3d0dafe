"""The features scoring requests carry against those the served model declares.

A request's values are read by name, and a name the model does not read where it is given is
ignored (`streamrec.serving.features`): a client that sends ``genre`` for the declared
``genres``, a user feature in the context (scoring reads it from the profile store, or from
the request's ``user_features`` beside its own history), or no
value of a declared candidate feature at all gets scores from defaults, with 200 OK and no
word. `RequestDrift` warns of each such name once a model version: a name ignored where it is
given, and a declared feature no request has carried where it is read after ``absent_after``
requests (a user feature: after that many requests with their own history, the only ones that
read it from the request). Each server process warns of its own requests.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence

from streamrec.features.schema import FeatureSchema, FeatureSpec
from streamrec.samples import BUILTIN_FIELDS
from streamrec.serving.features import Candidate, GivenHistory

logger = logging.getLogger(__name__)

#: Requests after which a declared feature none of them carried is named.
ABSENT_AFTER = 1_000

#: Where a request gives feature values, and which declared features each place is read for.
PLACES: dict[str, Callable[[FeatureSpec], bool]] = {
    "context": lambda spec: spec.role == "context",
    "items": lambda spec: spec.role == "behaviour" and not spec.outcome,  # a candidate's own
    "history": lambda spec: spec.role == "behaviour",  # a request's own history, outcomes included
    "user_features": lambda spec: spec.role == "user",  # beside a request's own history
}

_SOURCES = {  # where scoring reads a feature of each role
    "user": "the profile store, by the user (or a request's 'user_features', beside its own 'history')",
    "behaviour": "the items' and the history's entries",
    "context": "the request's context",
}

_BUILTIN = frozenset(BUILTIN_FIELDS)


class RequestDrift:
    """Warns, once a model version for each, of request features the served model ignores.

    Examples:
        >>> from streamrec.features import FeatureSpec
        >>> schema = FeatureSchema.of([FeatureSpec(name="device", role="context"),
        ...                            FeatureSpec(name="tier", role="user")])
        >>> drift = RequestDrift(schema, version=3, absent_after=2)
        >>> drift.observe([Candidate("i1", features={"price": 2})], {"tier": "gold"})
        ((('context', 'tier'), ('items', 'price')), ())
        >>> drift.observe([Candidate("i2")], None)  # each named once; device never given
        ((), (('context', 'device'),))
    """

    def __init__(self, schema: FeatureSchema | None, version: int, absent_after: int = ABSENT_AFTER) -> None:
        """Compare requests with ``schema`` (None: no declared features), that of ``version``."""
        self._schema = schema or FeatureSchema.default()
        self._version = version
        self._absent_after = absent_after
        self._expected = {  # a request's own history is the exception: not expected
            place: {f.name for f in self._schema.extras if PLACES[place](f)} for place in ("context", "items")
        }
        # a request with its own history reads the user's features from its user_features only
        self._users = {f.name for f in self._schema.extras if f.role == "user"}
        self._own_histories = 0
        self._carried: dict[str, set[str]] = {place: set() for place in PLACES}
        self._named: set[tuple[str, str]] = set()
        self._requests = 0
        self._settled = False  # the absent features named: a request of names seen names nothing
        self._lock = threading.Lock()  # requests are scored on several threads

    def observe(
        self,
        candidates: Sequence[Candidate],
        context: Mapping[str, object] | None,
        history: Sequence[tuple[str, str]] = (),
    ) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
        """Warn of what this request shows for the first time; return what it named.

        Returns:
            (place, name) of the names given where they are ignored, and of the declared
            features none of the first ``absent_after`` requests carried where they are read.
        """
        items: set[str] = set()
        for candidate in candidates:  # most carry none: a loop skips them faster than a union
            if candidate.features:
                items.update(candidate.features)
        given = {
            "context": set(context or ()),
            "items": items,
            "history": set().union(*history.given) if isinstance(history, GivenHistory) else set(),
            "user_features": set(history.user_features) if isinstance(history, GivenHistory) else set(),
        }
        # counted until the check: past it such a request takes the lock-free path again
        counting = bool(self._users) and self._own_histories < self._absent_after
        own = counting and isinstance(history, GivenHistory)
        if self._settled and not own and all(names <= self._carried[place] for place, names in given.items()):
            return (), ()  # nothing new can be named: no lock (the sets only grow, under it)
        with self._lock:
            ignored = []
            for place, names in given.items():
                self._carried[place] |= names
                for name in sorted(names - _BUILTIN):
                    if (place, name) not in self._named and not self._reads(place, name):
                        self._named.add((place, name))
                        ignored.append((place, name))
                        logger.warning("requests' %s carry %r, %s: it is ignored", place, name,
                                       self._why(place, name))
            self._requests += 1
            absent = []
            if self._requests >= self._absent_after and not self._settled:
                self._settled = True  # what is absent now is named now; later, only new names
                for place, expected in self._expected.items():
                    for name in sorted(expected - self._carried[place]):
                        if (place, name) not in self._named:
                            self._named.add((place, name))
                            absent.append((place, name))
                            logger.warning(
                                "no request's %s has carried feature %r, which the served model (v%d) "
                                "reads there, in %d requests: each reads its default", place, name,
                                self._version, self._requests,
                            )
            if own:
                absent.extend(self._absent_users())
        return tuple(ignored), tuple(absent)

    def _absent_users(self) -> list[tuple[str, str]]:
        """The user features none of the first ``absent_after`` requests with their own history carried."""
        self._own_histories += 1
        if self._own_histories < self._absent_after:
            return []
        absent = []
        for name in sorted(self._users - self._carried["user_features"]):
            if ("user_features", name) not in self._named:
                self._named.add(("user_features", name))
                absent.append(("user_features", name))
                logger.warning(
                    "no request with its own history has carried user feature %r in its 'user_features' "
                    "in %d such requests, which the served model (v%d) reads there: each reads its default",
                    name, self._own_histories, self._version,
                )
        return absent

    def _reads(self, place: str, name: str) -> bool:
        return name in self._schema and PLACES[place](self._schema[name])

    def _why(self, place: str, name: str) -> str:
        if name not in self._schema:
            return f"which the served model (v{self._version}) does not declare"
        spec = self._schema[name]
        if spec.outcome and place == "items":
            return "an outcome, which scoring reads along the history only (a candidate has none yet)"
        return f"a {spec.role} feature, which scoring reads from {_SOURCES[spec.role]}"
