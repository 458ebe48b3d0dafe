"""A rater's history so far, as fields of each of their ratings: point in time, never its own.

MovieLens has no user fields, yet a rater's past says what kind of rater they are: how many
movies they have rated (a newcomer or a veteran) and how generously (their mean rating). The
MovieLens readers give each rating these as fields (`USER_HISTORY_FIELDS`), to declare with
role ``user``:

- ``user_ratings``: how many ratings the user gave *strictly before* this one's time (0 for
  their first);
- ``user_mean_rating``: the mean of those ratings (absent for the first: the feature's
  default downstream).

Strictly before, not "earlier in the file": a user often rates many movies within the same
second, and a sample reads its user's features as of its own time (ties included, in whatever
order they came), so a value that counted a rating at the same second could carry that
rating, the sample's label, into it. Ratings at one second all get the same values.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import MutableMapping, Sequence
from itertools import groupby
from typing import cast

from streamrec.events import Event

#: The fields `so_far` gives each rating.
USER_HISTORY_FIELDS = ("user_ratings", "user_mean_rating")


def so_far(events: Sequence[Event], fields: Sequence[MutableMapping[str, object]]) -> None:
    """Add each user's history so far to the fields of their ratings (``fields[i]`` is ``events[i]``'s).

    Each field mapping's ``rating`` (a float) is that event's rating; the events may come in
    any order (a file's, grouped by user).
    """
    by_user: defaultdict[str, list[int]] = defaultdict(list)
    for i, event in enumerate(events):
        by_user[event.user_id].append(i)
    for indices in by_user.values():
        indices.sort(key=lambda i: events[i].ts)
        count, total = 0, 0.0
        for _, same_time in groupby(indices, key=lambda i: events[i].ts):
            at_once = list(same_time)  # one second's ratings: none sees another
            for i in at_once:
                fields[i]["user_ratings"] = float(count)
                if count:
                    fields[i]["user_mean_rating"] = total / count
            count += len(at_once)
            total += sum(cast(float, fields[i]["rating"]) for i in at_once)
