"""Sampler tells: a match feature alone scoring the labels reads ~0.5 on honest samples and
~1.0 where the negative sampler gives the label away.
"""

from __future__ import annotations

import math

import numpy as np

from streamrec.learner.columns import SampleColumns
from streamrec.learner.match import match_features
from streamrec.learner.metrics import MicroBatchMetrics
from streamrec.samples import Sample

CATEGORIES = ("c0", "c1", "c2", "c3")


def samples(planted: bool, n: int = 2000, seed: int = 0) -> list[Sample]:
    """Users with a history; with ``planted`` a positive's target is always from the history
    and in its category, a negative's never (as a sampler that avoids the history); else the
    target is from the history half the time whatever the label.
    """
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        label = int(rng.random() < 0.5)
        history = tuple(f"h{k}-{j}" for j in range(5))
        cats = tuple(CATEGORIES[int(c)] for c in rng.integers(0, 2, size=5))
        from_history = bool(label) if planted else bool(rng.random() < 0.5)
        if from_history:
            j = int(rng.integers(0, 5))
            item, cat = history[j], cats[j]
        else:
            item, cat = f"new{k}", CATEGORIES[2 + int(rng.integers(0, 2))] if planted else cats[0]
        out.append(Sample(f"s{k}", f"u{k % 50}", k, item, cat, label, history, cats))
    return out


def metrics(planted: bool) -> MicroBatchMetrics:
    batch = SampleColumns.from_samples(samples(planted))
    probs = np.full(len(batch), 0.5)
    known = np.ones(len(batch))
    return MicroBatchMetrics.compute(batch.label, probs, batch.user_ids, known, match_features(batch))


def test_a_planted_tell_is_caught() -> None:
    m = metrics(planted=True)
    assert m.tell_history_auc == 1.0 and m.tell_category_auc == 1.0


def test_honest_samples_read_about_one_half() -> None:
    m = metrics(planted=False)
    assert abs(m.tell_history_auc - 0.5) < 0.04 and abs(m.tell_category_auc - 0.5) < 0.04


def test_without_features_the_tells_are_unknown() -> None:
    m = MicroBatchMetrics.compute(np.array([0, 1]), np.array([0.2, 0.7]), np.array(["u", "u"]), np.zeros(2))
    assert math.isnan(m.tell_history_auc) and math.isnan(m.tell_category_auc)
