"""The window negative sampler: window eviction, exclusion, determinism."""

from __future__ import annotations

from streamrec.consumers.negatives import WindowNegativeSampler


def test_pool_keeps_only_the_event_time_window() -> None:
    sampler = WindowNegativeSampler(window_ms=1000, pool_size=100)
    for ts in (0, 500, 1000, 1600):
        sampler.observe(ts, f"i{ts}", "c")
    assert len(sampler) == 2  # 0 and 500 fell out when 1600 arrived (horizon 600)
    assert {item for item, _ in sampler.draw(2, exclude=(), key="e")} == {"i1000", "i1600"}


def test_draws_are_distinct_exclude_given_items_and_count_shortfalls() -> None:
    sampler = WindowNegativeSampler(window_ms=10**9, pool_size=100)
    for i in range(3):
        sampler.observe(i, f"i{i}", f"c{i}")
    drawn = sampler.draw(5, exclude={"i0"}, key="e")
    assert sorted(drawn) == [("i1", "c1"), ("i2", "c2")]
    assert sampler.short == 3


def test_same_pool_and_key_give_the_same_draw() -> None:
    def build() -> WindowNegativeSampler:
        sampler = WindowNegativeSampler(window_ms=10**9, pool_size=1000, seed=3)
        for i in range(500):
            sampler.observe(i, f"i{i}", "c")
        return sampler

    assert build().draw(4, (), "e42") == build().draw(4, (), "e42")
    assert build().draw(4, (), "e42") != build().draw(4, (), "e43")


def test_empty_pool_draws_nothing() -> None:
    sampler = WindowNegativeSampler(window_ms=10, pool_size=10)
    assert sampler.draw(2, (), "e") == []
    assert sampler.short == 2
