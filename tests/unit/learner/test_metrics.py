"""Tests for ``streamrec.learner.metrics`` against hand-computed values."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pytest

from streamrec.learner.metrics import MicroBatchMetrics, auc, gauc, logloss


def _pairwise_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    pos, neg = scores[labels == 1], scores[labels == 0]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(wins / (len(pos) * len(neg)))


def test_auc_perfect_reversed_and_ties() -> None:
    assert auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.2, 0.8, 0.9])) == 1.0
    assert auc(np.array([1, 1, 0, 0]), np.array([0.1, 0.2, 0.8, 0.9])) == 0.0
    # Pairs (pos, neg): (.9,.1) (.9,.5) (.5,.1) win, (.5,.5) ties: 3.5 / 4.
    assert auc(np.array([0, 1, 0, 1]), np.array([0.1, 0.9, 0.5, 0.5])) == 0.875
    assert auc(np.array([0, 1, 0, 1]), np.full(4, 0.3)) == 0.5


def test_auc_single_class_or_empty_is_nan() -> None:
    assert math.isnan(auc(np.array([1, 1]), np.array([0.2, 0.3])))
    assert math.isnan(auc(np.array([0, 0]), np.array([0.2, 0.3])))
    assert math.isnan(auc(np.array([]), np.array([])))


def test_auc_matches_pairwise_count_with_many_ties() -> None:
    rng = np.random.default_rng(0)
    labels = (rng.random(400) < 0.3).astype(np.int64)
    scores = np.round(rng.random(400), 1)
    assert math.isclose(auc(labels, scores), _pairwise_auc(labels, scores))


def test_gauc_weights_users_by_sample_count() -> None:
    labels = np.array([1, 0, 0, 1, 0, 1])
    scores = np.array([0.9, 0.1, 0.5, 0.2, 0.8, 0.4])
    users = np.array(["a", "a", "a", "b", "b", "c"])
    # a: AUC 1 over 3 samples, b: AUC 0 over 2, c: only positives, left out -> 3/5.
    assert math.isclose(gauc(labels, scores, users), 0.6)


def test_gauc_ties_within_user_and_interleaved_rows() -> None:
    labels = np.array([1, 1, 0, 0, 0])
    scores = np.array([0.5, 0.7, 0.5, 0.7, 0.1])
    users = np.array(["x", "y", "x", "y", "y"])
    # x: tie -> 0.5 over 2; y: .7 vs .7 tie, .7 vs .1 win -> 0.75 over 3.
    assert math.isclose(gauc(labels, scores, users), (2 * 0.5 + 3 * 0.75) / 5)


def test_gauc_nan_when_no_user_has_both_classes() -> None:
    assert math.isnan(gauc(np.array([1, 0]), np.array([0.3, 0.4]), np.array(["a", "b"])))
    assert math.isnan(gauc(np.array([]), np.array([]), np.array([], dtype=str)))


def test_logloss_value_and_clipping() -> None:
    got = logloss(np.array([1, 0]), np.array([0.8, 0.4]))
    assert math.isclose(got, -(math.log(0.8) + math.log(0.6)) / 2)
    worst = logloss(np.array([0, 1]), np.array([1.0, 0.0]))
    assert math.isclose(worst, -math.log(1e-7), rel_tol=1e-6)
    assert math.isnan(logloss(np.array([]), np.array([])))


def test_batch_metrics_compute() -> None:
    labels = np.array([1, 0, 1, 0], dtype=np.float32)
    probs = np.array([0.9, 0.2, 0.3, 0.6])
    users = np.array(["a", "a", "b", "b"])
    known = np.array([True, True, False, True])
    m = MicroBatchMetrics.compute(labels, probs, users, known)
    assert (m.samples, m.positives, m.known_samples) == (4, 2, 3)
    assert m.auc == 0.75 and m.gauc == 0.5 and m.known_auc == 1.0
    assert math.isclose(m.logloss, logloss(labels, probs))


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: auc(np.array([0, 1, 1]), np.array([0.1, 0.2])), ValueError, "different lengths"),
        (lambda: gauc(np.array([0, 1]), np.array([0.1, 0.2]), np.array(["a"])), ValueError, "users"),
        (lambda: logloss(np.array([0, 1, 0]), np.array([0.1, 0.2])), ValueError, "different lengths"),
        (lambda: auc(np.array([[0, 1]]), np.array([[0.1, 0.2]])), ValueError, "1-D"),
        (lambda: auc(np.array([0, 1]), np.array(["x", "y"])), TypeError, "scores"),
        (lambda: auc(np.array([0, np.nan, 1]), np.array([0.1, 0.2, 0.3])), ValueError, "labels hold NaN"),
        (lambda: logloss(np.array([1, 0]), np.array([5.0, -3.0])), ValueError, "[0, 1]"),
    ],
)
def test_bad_arrays_are_refused_naming_the_argument(call: Any, error: type[Exception], words: str) -> None:
    # Found by the Python-API tour: mismatched lengths raised numpy's "all keys need to be the
    # same shape", string scores ranked lexically, and logits were clipped into a tiny loss.
    with pytest.raises(error, match=re.escape(words)):
        call()


def test_a_nan_score_gives_nan_not_a_ranking() -> None:
    # NaN sorts last: all-NaN scores made an AUC of 1.0, one NaN made the GAUC 1.0 (the tour).
    labels = np.array([0, 1, 0, 1])
    assert math.isnan(auc(labels, np.full(4, np.nan)))
    assert math.isnan(gauc(labels, np.array([0.1, np.nan, 0.3, 0.4]), np.array(["a", "a", "b", "b"])))
    assert math.isnan(logloss(labels, np.array([0.1, np.nan, 0.3, 0.4])))
    assert auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == 0.75  # type: ignore[arg-type]  # lists still do
