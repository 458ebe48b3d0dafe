"""User features (role ``user``) kept with their event times, read point in time.

A user feature is a property of the user (an age band, a membership) that events carry. The
store keeps, per user and feature, the newest ``points`` values with the event time each was
stamped at (a *point*), and a sample at time ``ts`` gets, by `user_values`, the value of the
newest point at or before ``ts``: never a later one, whatever order the events arrived in.

What is kept is the ``points`` newest points by event time of all that ever arrived (within
the TTL): the same whatever the arrival order, and a redelivered event, whose points are
already there, changes nothing. Hence:

- a point older than every one kept, when ``points`` are kept already, is dropped (it would
  be the first trimmed);
- a sample older than every point kept for a feature gets nothing for it (the feature reads
  its default), never the oldest kept value, which is later than the sample;
- points at one event time are ordered by their encoded value (bytes), so the newest among
  them, the one a sample at that time gets, does not depend on the arrival order either.

Every point counts, a value equal to the one before it too: dropping such a point is wrong
once a late point with another value lands between the two. A feature sent with every
event so fills its points with the user's last ``points`` events' values, and a sample reads
it exactly unless ``points`` or more of its user's later-stamped points arrived before it.
Lowering ``points`` trims a feature's points at its next write.

`ProfileStore` is the interface, `MemoryProfileStore` the in-process store; the Redis one
is `streamrec.featurestore.redis_profiles.RedisProfileStore`.
"""

from __future__ import annotations

import bisect
import functools
from abc import abstractmethod
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import orjson

from streamrec.closing import Closing
from streamrec.features.schema import Value

#: A user's points: feature name -> (event time, value), oldest first.
Profile = dict[str, tuple[tuple[int, Value], ...]]


@dataclass(frozen=True, slots=True)
class ProfilePoint:
    """The user features one event carries, stamped with its event time."""

    user_id: str
    ts: int
    values: Mapping[str, Value]


def encode_value(value: Value) -> bytes:
    """A value's stored form (JSON): no newline or control character, byte-ordered as Redis orders it."""
    return orjson.dumps(value)


# A user feature takes few distinct values (tiers, age bands), read back by the thousand a batch:
# a cache of this size holds them all, and its values (str, float, tuple) are immutable.
@functools.lru_cache(maxsize=4096)
def decode_value(raw: bytes | str) -> Value:
    """Inverse of `encode_value` (a list comes back as a tuple)."""
    value = orjson.loads(raw)
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, int):  # a number stored as an integer by another writer
        return float(value)
    return cast(Value, value)  # a str or a float: what encode_value wrote


def user_values(profile: Mapping[str, Sequence[tuple[int, Value]]], ts: int,
                names: Collection[str] | None = None) -> dict[str, Value]:
    """Each feature's value as of ``ts``: its newest point at or before ``ts``.

    A feature with no point that old is left out (it reads its default); so is one not in
    ``names``, when given (a feature no longer declared).

    Examples:
        >>> profile = {"tier": ((100, "silver"), (200, "gold")), "age": ((300, "30-39"),)}
        >>> user_values(profile, 250)
        {'tier': 'gold'}
        >>> user_values(profile, 150), user_values(profile, 99)
        ({'tier': 'silver'}, {})
        >>> user_values(profile, 300, names={"age"})
        {'age': '30-39'}
    """
    out: dict[str, Value] = {}
    for name, points in profile.items():
        if names is not None and name not in names:
            continue
        at = bisect.bisect_right(points, ts, key=_time)
        if at:
            out[name] = points[at - 1][1]
    return out


def _time(point: tuple[int, object]) -> int:
    return point[0]


class ProfileStore(Closing):
    """Each user's newest ``points`` user-feature points per feature, by event time.

    See the module's docstring for what is kept and what a read as of an early time gives.
    Closed by `close` or a ``with`` block, as a `FeatureStore` is.
    """

    def __init__(self, points: int) -> None:
        """Keep the newest ``points`` points of each user's feature."""
        if points < 1:
            raise ValueError(f"a profile store keeps at least one point per feature, not {points}")
        self.points = points

    @abstractmethod
    def update(self, changes: Sequence[ProfilePoint], read: Iterable[str] = ()) -> dict[str, Profile]:
        """Record ``changes`` and return the profiles of the users in ``read``, changes included.

        Idempotent: the same changes again change nothing. A user with no points reads ``{}``.
        """

    def profile(self, user_id: str) -> Profile:
        """One user's profile."""
        return self.update((), (user_id,))[user_id]

    def close(self) -> None:
        """Release what the store holds (nothing, in process); safe to call more than once."""


def merge_point(points: list[tuple[int, bytes]], ts: int, value: bytes, keep: int) -> bool:
    """Insert ``(ts, value)`` into ``points`` (sorted), keeping the newest ``keep``.

    Returns whether ``points`` changed: not for a point already there, nor for one older
    than the ``keep`` kept.
    """
    point = (ts, value)  # the order of every feature's points: time, then stored form
    at = bisect.bisect_left(points, point)
    if at < len(points) and points[at] == point:
        return False
    if len(points) >= keep and at == 0:
        return False
    points.insert(at, point)
    del points[: max(0, len(points) - keep)]
    return True


class MemoryProfileStore(ProfileStore):
    """Profiles in a dict, for backtests and tests; no TTL (a backtest is bounded).

    Examples:
        >>> store = MemoryProfileStore(points=2)
        >>> changes = [ProfilePoint("u1", 300, {"tier": "gold"}), ProfilePoint("u1", 100, {"tier": "basic"})]
        >>> profile = store.update(changes, ["u1"])["u1"]
        >>> profile
        {'tier': ((100, 'basic'), (300, 'gold'))}
        >>> user_values(profile, 200)
        {'tier': 'basic'}
    """

    def __init__(self, points: int = 16) -> None:
        """An empty store keeping ``points`` points per user and feature."""
        super().__init__(points)
        self._users: dict[str, dict[str, list[tuple[int, bytes]]]] = {}

    def update(self, changes: Sequence[ProfilePoint], read: Iterable[str] = ()) -> dict[str, Profile]:
        """See `ProfileStore.update`."""
        for change in changes:
            user = self._users.setdefault(change.user_id, {})
            for name, value in change.values.items():
                merge_point(user.setdefault(name, []), change.ts, encode_value(value), self.points)
        return {user_id: self._profile(user_id) for user_id in read}

    def _profile(self, user_id: str) -> Profile:
        features = self._users.get(user_id, {})
        return {
            name: tuple((ts, decode_value(raw)) for ts, raw in points)
            for name, points in features.items()
            if points
        }


def with_points(profiles: dict[str, Profile], points: Sequence[ProfilePoint]) -> dict[str, Profile]:
    """``profiles`` (read after ``points`` were written) with every one of ``points`` in them.

    Ordered as every store orders a feature's points (`merge_point`: by time, then stored form),
    each once. A store keeps a feature's newest `ProfileStore.points` points, a batch's included,
    so a user with more events in one batch than that read nothing at their earliest (in the
    MovieLens example, 74,005 samples of 100,004); adding the batch's points back gives each
    sample its own event's value, and the same in a redone batch (the store reads the same
    after the same points). `streamrec.consumers.user_features.UserFeatures.update` asks it.
    """
    added: dict[str, dict[str, list[tuple[int, Value]]]] = {}
    for point in points:
        features = added.setdefault(point.user_id, {})
        for name, value in point.values.items():
            features.setdefault(name, []).append((point.ts, value))
    out = dict(profiles)
    for user, features in added.items():
        profile = dict(out.get(user, {}))
        for name, new in features.items():
            merged = {(ts, encode_value(value)): (ts, value) for ts, value in (*profile.get(name, ()), *new)}
            profile[name] = tuple(merged[key] for key in sorted(merged))
        out[user] = profile
    return out
