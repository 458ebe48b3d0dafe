"""The simple baselines: what earlier micro-batches said about each item."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from streamrec.learner.base import Learner
from streamrec.learner.columns import SampleColumns
from streamrec.replay.baselines import PRIOR_SAMPLES, ItemRateLearner, PopularityLearner
from streamrec.replay.features import FeaturesLearner
from streamrec.samples import Sample


def batch(*rows: tuple[str, int]) -> SampleColumns:
    samples = [Sample(f"s{n}", "u", n, item, "c", label, (), ()) for n, (item, label) in enumerate(rows)]
    return SampleColumns.from_samples(samples)


def test_popularity_ranks_by_earlier_positives_only() -> None:
    learner = PopularityLearner()
    assert np.ptp(learner.predict_many(batch(("a", 1), ("b", 0)))) == 0  # nothing known yet
    learner.learn_many(batch(("a", 1), ("a", 1), ("b", 1), ("c", 0), ("c", 0), ("c", 0)))
    scores = learner.predict_many(batch(("a", 0), ("b", 0), ("c", 0), ("new", 0)))
    assert scores[0] > scores[1] > scores[2] == scores[3]  # c's samples were all negatives
    assert ((scores > 0) & (scores < 1)).all()
    assert learner.is_known(batch(("a", 0), ("new", 0))).tolist() == [True, False]


def test_item_rate_is_a_beta_smoothed_rate_around_the_global_one() -> None:
    learner = ItemRateLearner()
    learner.learn_many(batch(*([("a", 1)] * 30), *([("b", 0)] * 10)))
    prior = 30 / 40
    scores = learner.predict_many(batch(("a", 0), ("b", 0), ("new", 0)))
    k = PRIOR_SAMPLES
    expected = [(30 + k * prior) / (30 + k), k * prior / (10 + k), prior]
    assert np.allclose(scores, expected)


def test_baseline_state_round_trips() -> None:
    learner = ItemRateLearner()
    learner.learn_many(batch(("a", 1), ("b", 0)))
    restored = ItemRateLearner()
    restored.load_state_arrays(learner.state_arrays())
    probe = batch(("a", 0), ("b", 0), ("x", 0))
    assert np.array_equal(restored.predict_many(probe), learner.predict_many(probe))
    assert math.isnan(learner.learn_many(batch(("a", 1))).loss)  # counting has no loss


@pytest.mark.parametrize("make", [PopularityLearner, ItemRateLearner, FeaturesLearner])
def test_a_baseline_refuses_samples_that_are_not_columns(make: Callable[[], Learner]) -> None:
    # Found by the Python-API tour: a list of samples raised AttributeError "'list' object has no
    # attribute 'target_ids'" (FeaturesLearner.is_known took it, returning a wrong-sized answer).
    learner = make()
    samples = [Sample("e1", "u1", 1, "i1", "c1", 1, (), ())]
    for method in (learner.predict_many, learner.learn_many, learner.is_known):
        with pytest.raises(TypeError, match=r"SampleColumns\.from_samples\(samples\)\), not list"):
            method(samples)  # type: ignore[arg-type]
