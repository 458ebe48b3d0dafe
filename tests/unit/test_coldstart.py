"""The cold-start fallback: which samples are new, the prior, the popular ranking."""

from __future__ import annotations

import numpy as np
import pytest

from streamrec.coldstart import PRIOR_SAMPLES, ItemPrior, new_users, with_fallback
from streamrec.learner.columns import SampleColumns
from streamrec.samples import Sample


def _sample(user: str, item: str, label: int, history: list[str]) -> Sample:
    return Sample(
        sample_id=f"{user}-{item}",
        user_id=user,
        ts=1,
        label=label,
        item_id=item,
        category_id="c",
        seq_items=tuple(history),
        seq_categories=("c",) * len(history),
    )


def _prior() -> ItemPrior:
    prior = ItemPrior()
    prior.learn(["a", "a", "a", "b", "b"], [1, 1, 0, 0, 0])
    return prior


def test_an_unknown_item_gets_the_global_rate_and_a_known_one_its_smoothed_rate() -> None:
    prior = _prior()
    rate = 2 / 5
    got = prior.prior(["a", "b", "zzz"])
    k = PRIOR_SAMPLES
    want = [(2 + k * rate) / (3 + k), (0 + k * rate) / (2 + k), rate]
    assert got.tolist() == pytest.approx(want)
    assert prior.known(["a", "zzz"]).tolist() == [True, False]


def test_the_popular_ranking_orders_by_positives_and_puts_an_unseen_item_last() -> None:
    prior = _prior()
    assert prior.top(5) == ["a", "b"]
    pop = prior.popularity(["b", "a", "zzz"])
    assert pop[1] > pop[0] == pop[2] == 0.5


def test_new_users_are_those_with_an_empty_history() -> None:
    batch = SampleColumns.from_samples([_sample("u1", "a", 1, []), _sample("u2", "a", 0, ["b"])])
    assert new_users(batch).tolist() == [True, False]


def test_the_fallback_replaces_only_the_new_samples_scores() -> None:
    prior = _prior()
    batch = SampleColumns.from_samples(
        [
            _sample("old", "a", 1, ["b"]),  # known user, known item: the model's score
            _sample("old", "zzz", 0, ["b"]),  # known user, new item: the prior
            _sample("new", "b", 0, []),  # new user: the popular ranking
            _sample("new", "zzz", 0, []),  # new user, new item: the popular ranking too
        ]
    )
    model = np.array([0.9, 0.8, 0.7, 0.6])
    out = with_fallback(model, batch, prior, items=True, users=True)
    assert out.tolist() == pytest.approx([0.9, 0.4, *prior.popularity(["b", "zzz"]).tolist()])
    assert with_fallback(model, batch, prior, items=False, users=False).tolist() == model.tolist()
    only_items = with_fallback(model, batch, prior, items=True, users=False)
    assert only_items.tolist() == pytest.approx([0.9, 0.4, 0.7, 0.4])


def test_a_new_item_gets_its_categorys_rate_and_a_known_one_is_smoothed_toward_it() -> None:
    prior = ItemPrior()
    prior.learn(["a", "a", "b", "x"], [1, 1, 1, 0], ["shoes", "shoes", "shoes", "hats"])
    k, rate = PRIOR_SAMPLES, 3 / 4
    shoes, hats = (3 + k * rate) / (3 + k), (0 + k * rate) / (1 + k)
    got = prior.prior(["new-shoe", "new-hat", "a", "new-other"], ["shoes", "hats", "shoes", "socks"])
    assert got.tolist() == pytest.approx([shoes, hats, (2 + k * shoes) / (2 + k), rate])
    assert got[0] > got[1]  # the category's own record decides between two new items
    copied = prior.copy()
    prior.learn(["y"], [0], ["shoes"])
    assert copied.prior(["new-shoe"], ["shoes"]).tolist() == pytest.approx([shoes])


def test_the_fallback_reads_the_new_items_category() -> None:
    prior = ItemPrior()
    prior.learn(["a", "b"], [1, 0], ["c", "d"])
    batch = SampleColumns.from_samples([_sample("old", "zzz", 0, ["a"])])  # category "c"
    k = PRIOR_SAMPLES
    out = with_fallback(np.array([0.9]), batch, prior, items=True, users=False)
    assert out.tolist() == pytest.approx([(1 + k * 0.5) / (1 + k)])
