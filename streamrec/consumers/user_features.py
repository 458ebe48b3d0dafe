"""The sample builder's side of user features (role ``user``): written, then read as of each sample.

Per batch, one `ProfileStore.update` writes the user features every kept event carries (a
late event kept in its sequence too: it is still what the user was at its time) and reads the
profiles of the batch's users, after the sequence store's verdicts and before any of its
samples is built; each sample, a positive and its negatives alike, then gets `user_values` as
of its own time. The batch's own points are in the profiles read, so a sample sees a value its
event carries, or one stamped earlier in the batch, and never one stamped later, in whatever
order the events came. A redone batch writes the same points (nothing changes) and reads the
same profiles.

An event whose id turns out a conflict (an id reused for other content, dead-lettered by the
sequence store's verdict) writes no point: the verdicts come first. The price: with user
features declared, a batch's samples are built once the store has answered for all its
users, not while it answers. A ``join``-mode impression takes its values as of its time when
it arrives, and its window keeps them for the sample decided later
(`streamrec.consumers.joins.JoinRule`).

The values are the parsed event's (``Event.features``, checked as it was read).
`streamrec consumers rebuild` writes them too (`UserFeatures.update` without reading).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from streamrec.events import Event
from streamrec.features.schema import FeatureSpec, Value
from streamrec.featurestore.profiles import Profile, ProfilePoint, ProfileStore, user_values, with_points


class UserFeatures:
    """The declared user features of a builder, and the store that keeps them.

    Does nothing when none is declared (the sample builder then never asks it).
    """

    def __init__(self, store: ProfileStore | None, specs: Sequence[FeatureSpec]) -> None:
        """Keep ``specs`` (the schema's ``role("user")``) in ``store``.

        Raises:
            ValueError: user features are declared but no store is given.
        """
        if specs and store is None:
            raise ValueError("user features are declared: the sample builder needs a profile store")
        self._names = frozenset(spec.name for spec in specs)
        self._store = store if specs else None

    @property
    def enabled(self) -> bool:
        """Whether user features are declared (else `update` writes and reads nothing)."""
        return self._store is not None

    def update(self, events: Sequence[Event], read: bool = True) -> dict[str, Profile]:
        """Write the events' user features; the profiles of their users, these included, if ``read``."""
        if self._store is None or not events:
            return {}
        points = []
        for event in events:
            values = {name: v for name, v in event.features.items() if name in self._names}
            if values:
                points.append(ProfilePoint(event.user_id, event.ts, values))
        users = dict.fromkeys(event.user_id for event in events) if read else ()
        profiles = self._store.update(points, users)
        return with_points(profiles, points) if read else profiles

    def as_of(self, profiles: Mapping[str, Profile], event: Event) -> dict[str, Value]:
        """The user's declared features as of the event's time (``{}``: none known)."""
        profile = profiles.get(event.user_id) if profiles else None
        return user_values(profile, event.ts, self._names) if profile else {}

