"""A rater's history so far (`streamrec.datasets.user_history`): point in time, never the rating's own."""

from __future__ import annotations

import csv
import random
from collections import defaultdict
from pathlib import Path

from streamrec.datasets.readers import read_rows
from streamrec.datasets.user_history import so_far
from streamrec.events import Event


def rating(user: str, movie: str, ts: int) -> Event:
    return Event(f"ml{user}-{movie}", user, movie, "Drama", "rate", ts * 1000, None)


def test_only_strictly_earlier_ratings_count_in_any_order() -> None:
    events = [rating("u1", "a", 10), rating("u1", "b", 10), rating("u1", "c", 20), rating("u2", "d", 15)]
    ratings = [4.0, 2.0, 5.0, 3.0]
    order = [2, 3, 1, 0]  # not in time order, as a file grouped by user is not
    fields: list[dict[str, object]] = [{"rating": ratings[i]} for i in order]
    so_far([events[i] for i in order], fields)
    got = {events[i].item_id: f for i, f in zip(order, fields, strict=True)}
    # the first second's two ratings see nothing, not each other: a rating's own is its label
    assert got["a"] == {"rating": 4.0, "user_ratings": 0.0}
    assert got["b"] == {"rating": 2.0, "user_ratings": 0.0}
    assert got["c"] == {"rating": 5.0, "user_ratings": 2.0, "user_mean_rating": 3.0}
    assert got["d"] == {"rating": 3.0, "user_ratings": 0.0}  # another user's history is theirs


def test_a_rating_never_reaches_its_own_or_an_earlier_rating_fields() -> None:
    rng = random.Random(0)
    events = [rating(f"u{rng.randrange(3)}", f"m{k}", rng.randrange(6)) for k in range(60)]
    ratings = [rng.choice([0.5, 2.0, 3.5, 5.0]) for _ in events]
    before: list[dict[str, object]] = [{"rating": r} for r in ratings]
    so_far(events, before)
    for k in range(len(events)):  # change one rating (a label): nothing at or before its time moves
        changed: list[dict[str, object]] = [{"rating": r} for r in ratings]
        changed[k]["rating"] = 5.5 - ratings[k]
        so_far(events, changed)
        for i, event in enumerate(events):
            if event.ts <= events[k].ts and i != k:
                assert changed[i] == before[i]
        assert {n: v for n, v in changed[k].items() if n != "rating"} == {
            n: v for n, v in before[k].items() if n != "rating"
        }


def test_the_bundled_movielens_counted_from_the_raw_file(movielens_path: Path) -> None:
    rows = {event.event_id: fields for event, fields in read_rows(movielens_path)}
    # user 1's first seven ratings came before Dangerous Minds (2.0+2.5+3.0+3.5+2.0+2.5+4.0)
    assert rows["ml1-31"]["user_ratings"] == 7.0
    assert abs(float(rows["ml1-31"]["user_mean_rating"]) - 19.5 / 7) < 1e-12  # type: ignore[arg-type]
    # independently, for every rating: the count and mean of the user's strictly earlier ones
    by_user: defaultdict[str, list[tuple[int, float]]] = defaultdict(list)
    with (movielens_path / "ratings.csv").open() as fh:
        raw = list(csv.DictReader(fh))
    for r in raw:
        by_user[r["userId"]].append((int(r["timestamp"]), float(r["rating"])))
    for r in raw[::97]:
        earlier = [v for ts, v in by_user[r["userId"]] if ts < int(r["timestamp"])]
        fields = rows[f"ml{r['userId']}-{r['movieId']}"]
        assert fields["user_ratings"] == float(len(earlier))
        if earlier:
            assert abs(float(fields["user_mean_rating"]) - sum(earlier) / len(earlier)) < 1e-9  # type: ignore[arg-type]
        else:
            assert "user_mean_rating" not in fields
