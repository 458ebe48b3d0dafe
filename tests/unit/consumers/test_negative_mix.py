"""The mixed negative sampler: shares of same-category and history negatives besides the global
ones, honoured, deterministic, point in time, and its effect caught by the tells the learner
reports (a sampler with a planted tell is caught by its metric).
"""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from streamrec.config import ConsumerConfig, StreamrecConfig
from streamrec.consumers.negatives import MixedSampler
from streamrec.datasets.synthetic import ClickStreamSpec, generate_clicks
from streamrec.learner.columns import SampleColumns
from streamrec.learner.match import match_features
from streamrec.learner.metrics import TELLS, MicroBatchMetrics
from streamrec.replay.batches import build_samples
from streamrec.samples import Sample

MIN = 60_000
SPEC = ClickStreamSpec(users=60, events=4_000, duration_ms=6 * 3_600_000, seed=5)


def samples_of(**consumer: object) -> list[Sample]:
    """The samples the consumers build on a seeded click stream with these settings."""
    cfg = StreamrecConfig()
    cfg = cfg.model_copy(update={"consumer": cfg.consumer.model_copy(update={"negatives": 2, **consumer})})
    return build_samples(generate_clicks(SPEC), cfg)


def shares(samples: list[Sample]) -> tuple[float, float]:
    """Of the negatives: the share whose item is in their history, and the share whose
    category is (the item not).
    """
    negatives = [s for s in samples if s.label == 0]
    in_history = [s.item_id in s.seq_items for s in negatives]
    in_category = [s.item_id not in s.seq_items and s.category_id in s.seq_categories for s in negatives]
    return float(np.mean(in_history)), float(np.mean(in_category))


def tells(samples: list[Sample]) -> dict[str, float]:
    """The tells as the learner computes them, over all the samples."""
    batch = SampleColumns.from_samples(samples)
    flat, known = np.full(len(batch), 0.5), np.ones(len(batch), bool)
    m = MicroBatchMetrics.compute(batch.label, flat, batch.user_ids, known, match_features(batch))
    return {name: getattr(m, name) for name in TELLS}


def test_shares_must_be_fractions_that_sum_to_at_most_one() -> None:
    ConsumerConfig(negative_category_share=0.5, negative_history_share=0.5)
    with pytest.raises(ValidationError, match="NEGATIVE_CATEGORY_SHARE.*NEGATIVE_HISTORY_SHARE.*at most 1"):
        ConsumerConfig(negative_category_share=0.7, negative_history_share=0.4)
    with pytest.raises(ValidationError):
        ConsumerConfig(negative_history_share=-0.1)


def test_the_default_draws_neither_history_nor_many_same_category_negatives() -> None:
    history, _ = shares(samples_of())
    assert history == 0.0  # the default never draws from the history: the planted tell


def test_the_mix_is_honoured_where_every_kind_of_draw_can_succeed() -> None:
    s = MixedSampler(60 * MIN, 10 * MIN, 10_000, category_share=0.4, history_share=0.3)
    for i in range(2_000):  # ten categories of known items, none of them the user's items
        s.observe(i * 1_000, f"i{i}", f"c{i % 10}", first_seen=0)
    items, categories = tuple(f"h{j}" for j in range(20)), ("c1",) * 20
    kinds = []
    for n in range(3_000):
        [(item, category, _)] = s.draw_mixed(
            1, new=False, ts=2_000_000, target="t", items=items, categories=categories, key=f"e{n}"
        )
        kinds.append("history" if item in items else "category" if category == "c1" else "global")
    rate = {kind: kinds.count(kind) / len(kinds) for kind in ("history", "category", "global")}
    assert rate["history"] == pytest.approx(0.3, abs=0.03)
    assert rate["category"] == pytest.approx(0.4 + 0.3 * 0.1, abs=0.03)  # a tenth of the global draws too
    assert rate["global"] == pytest.approx(0.3 * 0.9, abs=0.03)


def test_the_mix_shows_on_a_seeded_stream() -> None:
    _, base_category = shares(samples_of())
    history, category = shares(samples_of(negative_history_share=0.3, negative_category_share=0.4))
    # History draws fall back to the global pools for an empty history (or one holding only
    # the target): a little under the share.
    assert 0.25 <= history <= 0.31
    # Same-category draws fall back when a category has no recent item of the positive's
    # novelty (44% of these positives are new items): fewer than asked, but more than global.
    assert category > base_category + 0.05


def test_the_mix_is_deterministic() -> None:
    kw = {"negative_history_share": 0.25, "negative_category_share": 0.25}
    first = samples_of(**kw)
    assert first == samples_of(**kw)
    assert first != samples_of(**kw, seed=1)


def test_history_negatives_are_earlier_items_of_the_user_and_never_the_target() -> None:
    samples = samples_of(negative_history_share=1.0)
    positives = {s.sample_id: s for s in samples if s.label == 1}
    negatives = [s for s in samples if s.label == 0]
    drawn = [s for s in negatives if s.item_id in s.seq_items]
    assert len(drawn) > 0.8 * len(negatives)
    for s in negatives:
        positive = positives[s.sample_id.split("~")[0]]
        assert s.item_id != positive.item_id
        assert s.seq_items == positive.seq_items  # the same point-in-time history
    # Point in time: a history negative is an item the user had acted on before the event.
    earlier: dict[str, list[tuple[int, str]]] = {}
    for e in generate_clicks(SPEC):
        earlier.setdefault(e.user_id, []).append((e.ts, e.item_id))
    for s in drawn:
        assert any(ts <= s.ts and item == s.item_id for ts, item in earlier[s.user_id])


def test_same_category_negatives_come_from_the_users_categories_and_stay_out_of_the_history() -> None:
    samples = samples_of(negative_category_share=1.0)
    negatives = [s for s in samples if s.label == 0]
    with_history = [s for s in negatives if s.seq_items]
    assert all(s.item_id not in s.seq_items for s in negatives)
    same = np.mean([s.category_id in s.seq_categories for s in with_history])
    default = [s for s in samples_of() if s.label == 0 and s.seq_items]
    assert same > np.mean([s.category_id in s.seq_categories for s in default]) + 0.25


def test_a_planted_tell_is_caught_by_its_metric_and_the_mix_removes_it() -> None:
    """The default sampler never draws from the history and seldom from the user's
    categories: its tells give the label away, and the learner's tell metrics say so; with
    the mix they fall toward 0.5 (a positive's own history still tells a little).
    """
    planted = tells(samples_of())
    mixed = tells(samples_of(negative_history_share=0.2, negative_category_share=0.6))
    assert planted["tell_history_auc"] > 0.55
    assert planted["tell_category_auc"] > 0.75
    assert mixed["tell_history_auc"] < planted["tell_history_auc"] - 0.05
    assert mixed["tell_category_auc"] < planted["tell_category_auc"] - 0.15
    assert abs(mixed["tell_history_auc"] - 0.5) < abs(planted["tell_history_auc"] - 0.5)


def test_a_copy_draws_what_the_original_draws_and_stale_categories_are_dropped() -> None:
    s = MixedSampler(60 * MIN, 10 * MIN, 1000, seed=1, category_share=1.0, history_share=0.0)
    for i in range(200):
        s.observe(i * MIN, f"i{i}", f"c{i % 7}", first_seen=0)
    s.observe(10 * MIN, "stale", "gone", first_seen=0)
    kw = {"new": False, "ts": 200 * MIN, "target": "i0", "items": ("i3",), "categories": ("c3",), "key": "e"}
    drawn = s.draw_mixed(3, **kw)  # type: ignore[arg-type]  # the keywords, typed by the call
    assert drawn == s.copy().draw_mixed(3, **kw)  # type: ignore[arg-type]
    assert {category for _, category, _ in drawn} == {"c3"}
    assert "gone" not in s.copy().categories()


def test_a_category_pool_emptied_by_a_draw_is_dropped_by_the_next_copy() -> None:
    s = MixedSampler(10 * MIN, MIN, 2, category_share=1.0)
    for i in range(3):
        s.observe(i, f"i{i}", "c", first_seen=0)
    kw = {"new": False, "target": "t", "items": ("h",), "categories": ("c",), "key": "e"}
    s.draw_mixed(1, ts=100 * MIN, **kw)  # type: ignore[arg-type]  # the keywords above
    assert s.copy().categories() == []


def test_fallbacks_to_the_global_pools_and_shortfalls_are_counted() -> None:
    s = MixedSampler(60 * MIN, 10 * MIN, 1000, history_share=1.0)
    kw = {"new": False, "ts": 100 * MIN, "target": "t", "key": "e"}
    none = {"items": (), "categories": ()}  # no history
    assert s.draw_mixed(2, **none, **kw) == []  # type: ignore[arg-type]  # the keywords above
    assert (s.fallback, s.short) == (2, 2)  # no history to draw from, and no global pool either
    for i in range(50):
        s.observe(i * MIN, f"i{i}", "c", first_seen=0)
    assert len(s.draw_mixed(2, **none, **kw)) == 2  # type: ignore[arg-type]
    assert (s.fallback, s.short) == (4, 2)  # from the global pool: fallbacks, not short
    history = {"items": ("h1", "h2", "h3"), "categories": ("c", "c", "c")}
    assert len(s.draw_mixed(2, **history, **kw)) == 2  # type: ignore[arg-type]
    assert (s.fallback, s.short) == (4, 2)  # from the history, as asked
    assert (s.copy().fallback, s.copy().short) == (4, 2)  # a batch's copy counts on from here
    plain = MixedSampler(60 * MIN, 10 * MIN, 1000, category_share=0.0, history_share=0.0)
    for i in range(50):
        plain.observe(i * MIN, f"i{i}", "c", first_seen=0)
    plain.draw_mixed(2, **none, **kw)  # type: ignore[arg-type]
    assert plain.fallback == 0  # global draws meant as global are no fallbacks
