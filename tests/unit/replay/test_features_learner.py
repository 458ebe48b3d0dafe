"""The ``features`` baseline: an online logistic model on the causal match features."""

from __future__ import annotations

import numpy as np

from streamrec.config import StreamrecConfig
from streamrec.datasets.feed import FeedSpec, generate_feed
from streamrec.datasets.synthetic import ClickStreamSpec
from streamrec.learner.columns import SampleColumns
from streamrec.learner.metrics import auc
from streamrec.replay.batches import build_samples, by_interval
from streamrec.replay.features import FeaturesLearner
from tests.unit.learner.test_tells import samples


def batch(planted: bool, seed: int) -> SampleColumns:
    return SampleColumns.from_samples(samples(planted, n=1000, seed=seed))


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



def test_join_mode_micro_batches_do_not_saturate_it() -> None:
    """On a generated feed in the join mode (the first micro-batch all positives, the next
    nearly separable), undamped Newton steps overshot to weights of about +-200, where every
    score ties at 0 or 1 and GAUC reads 0.5.
    """
    clicks = ClickStreamSpec(users=200, events=4000, duration_ms=6 * 3_600_000, seed=0)
    events = generate_feed(FeedSpec(clicks=clicks, late_share=0.0, seed=0)).events
    cfg = StreamrecConfig()
    consumer = cfg.consumer.model_copy(
        update={"labels": "join", "label_window_ms": 600_000, "allowed_lateness_ms": 300_000}
    )
    batches = by_interval(build_samples(events, cfg.model_copy(update={"consumer": consumer})), 1_800_000)
    learner = FeaturesLearner()
    for micro in batches[:5]:
        learner.learn_many(SampleColumns.from_samples(micro.samples))
    assert np.abs(learner.weights).max() < 20
    fresh = SampleColumns.from_samples(batches[5].samples)
    assert len(np.unique(learner.predict_many(fresh))) > 10
