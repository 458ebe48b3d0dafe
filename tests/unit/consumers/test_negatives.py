"""The novelty-matched negative sampler: windows, strata, exclusion, determinism."""

from __future__ import annotations

import collections
import random

from streamrec.consumers.negatives import NO_VALUES, Entry, NoveltyMatchedSampler, _Pool

MIN = 60_000


def sampler(**kw: int) -> NoveltyMatchedSampler:
    args = {"window_ms": 60 * MIN, "novelty_ms": 10 * MIN, "pool_size": 1000} | kw
    return NoveltyMatchedSampler(**args)


def test_new_positives_get_recent_debuts_known_ones_get_known_items() -> None:
    s = sampler()
    s.observe(0, "old", "c", first_seen=0)           # debut at 0, known from minute 10
    s.observe(30 * MIN, "old", "c", first_seen=0)
    s.observe(31 * MIN, "fresh", "c", first_seen=31 * MIN)  # debut: new until minute 41
    t = 35 * MIN
    assert s.is_new(31 * MIN, t) and not s.is_new(0, t)
    assert s.draw(1, new=True, ts=t, exclude=(), key="e") == [("fresh", "c", {})]
    assert s.draw(1, new=False, ts=t, exclude=(), key="e") == [("old", "c", {})]


def test_pools_keep_only_their_event_time_windows() -> None:
    s = sampler(window_ms=10 * MIN, novelty_ms=2 * MIN)
    for minute in range(12):
        s.observe(minute * MIN, f"i{minute}", "c", first_seen=minute * MIN)
    recent, debuts = s.pool_sizes()
    assert recent == 11  # minutes 1..11: minute 0 is past the 10-minute horizon
    assert debuts == 3  # minutes 9, 10, 11


def test_draws_are_distinct_exclude_given_items_and_count_shortfalls() -> None:
    s = sampler()
    for i in range(3):
        s.observe(i, f"i{i}", f"c{i}", first_seen=i)
    drawn = s.draw(5, new=True, ts=3, exclude={"i0"}, key="e")
    assert sorted(drawn) == [("i1", "c1", {}), ("i2", "c2", {})]
    assert s.short == 3


def test_same_pool_and_key_give_the_same_draw() -> None:
    def build() -> NoveltyMatchedSampler:
        s = sampler(seed=3)
        for i in range(500):
            s.observe(i, f"i{i}", "c", first_seen=i)
        return s

    draw = build().draw(4, new=True, ts=500, exclude=(), key="e42")
    assert draw == build().draw(4, new=True, ts=500, exclude=(), key="e42")
    assert draw != build().draw(4, new=True, ts=500, exclude=(), key="e43")


def test_empty_pool_draws_nothing() -> None:
    s = sampler()
    assert s.draw(2, new=False, ts=0, exclude=(), key="e") == []
    assert s.short == 2


def test_a_pool_keeps_what_a_bounded_deque_evicted_by_time_keeps() -> None:
    """The list-and-head pool against the plain model: a deque of ``size`` newest entries,
    the oldest dropped while older than the horizon; copies taken at random points.
    """
    rng = random.Random(3)
    pool, model = _Pool(50), collections.deque[Entry](maxlen=50)
    ts, width = 0, 0
    for step in range(5000):
        if step % 250 == 0:  # windows of a few entries to many more than the size
            width = rng.choice((5, 40, 400))
        ts += rng.choice((0, 1, 1, 2, 7))
        horizon = ts - width
        if rng.random() < 0.7:
            pool.add((ts, f"i{step}", "c", ts, NO_VALUES), horizon)
            model.append((ts, f"i{step}", "c", ts, NO_VALUES))
        else:
            pool.evict(horizon)
        while model and model[0][0] < horizon:
            model.popleft()
        if rng.random() < 0.005:
            pool = pool.copy()
        assert pool.entries[pool.head :] == list(model)
        assert len(pool.entries) <= 2 * 50 + 1  # the dropped ones are freed as it goes
