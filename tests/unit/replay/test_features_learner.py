"""The ``features`` baseline: an online logistic model on the causal match features."""

from __future__ import annotations

import numpy as np

from streamrec.learner.batch import Batch
from streamrec.learner.metrics import auc
from streamrec.replay.features import FeaturesLearner
from tests.unit.learner.test_tells import samples


def batch(planted: bool, seed: int) -> Batch:
    return Batch.from_samples(samples(planted, n=1000, seed=seed))


def test_it_knows_nothing_before_training_and_learns_a_planted_tell() -> None:
    learner = FeaturesLearner()
    assert np.ptp(learner.predict_many(batch(True, 0))) == 0
    result = learner.learn_many(batch(True, 0))
    assert result.steps > 0 and np.isfinite(result.loss)
    fresh = batch(True, 1)
    assert auc(fresh.label, learner.predict_many(fresh)) == 1.0
    assert not learner.is_known(fresh).any()  # it has no ids to know


def test_honest_samples_teach_it_nothing() -> None:
    learner = FeaturesLearner()
    for seed in range(3):
        learner.learn_many(batch(False, seed))
    fresh = batch(False, 9)
    scores = learner.predict_many(fresh)
    assert abs(auc(fresh.label, scores) - 0.5) < 0.06 and abs(scores.mean() - fresh.label.mean()) < 0.05


def test_it_is_deterministic_and_its_state_round_trips() -> None:
    a, b = FeaturesLearner(), FeaturesLearner()
    for seed in range(2):
        a.learn_many(batch(True, seed))
        b.learn_many(batch(True, seed))
    probe = batch(False, 5)
    assert np.array_equal(a.predict_many(probe), b.predict_many(probe))
    c = FeaturesLearner()
    c.load_state_arrays(a.state_arrays())
    assert np.array_equal(c.predict_many(probe), a.predict_many(probe))
    c.learn_many(probe)
    a.learn_many(probe)
    assert np.array_equal(c.predict_many(probe), a.predict_many(probe))
