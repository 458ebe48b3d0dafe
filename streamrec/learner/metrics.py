"""Ranking and calibration metrics for prequential evaluation, in plain numpy.

AUC is the Mann-Whitney statistic (tied scores count one half); GAUC is the per-user AUC
weighted by each user's sample count, over users with both classes (the DIN paper's metric).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

# Probabilities are clipped to [eps, 1 - eps] for log loss: 1e-7 bounds one sample's loss at
# about 16 nats and stays representable next to 1.0 in float32 model outputs.
_LOGLOSS_EPS = 1e-7

#: Each tell's metric name -> the match feature (`streamrec.learner.match`) it scores alone.
TELLS = {"tell_history_auc": "target_in_history", "tell_category_auc": "category_share"}


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve; NaN when only one class is present or a score is NaN.

    Args:
        labels: [N] labels; values above 0.5 are positives.
        scores: [N] scores, higher meaning more likely positive.

    Raises:
        ValueError: the arrays are not 1-D of one length, or a label is NaN.
        TypeError: labels or scores are not numbers.

    Examples:
        >>> auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8]))
        0.75
        >>> auc(np.array([1, 1]), np.array([0.1, 0.2]))
        nan
    """
    labels, scores = _vectors(labels=labels, scores=scores)
    if np.isnan(scores).any():  # NaN sorts last: it would rank as the best score
        return math.nan
    groups = np.zeros(len(labels), dtype=np.int64)
    per_group, _, valid = _grouped_auc(labels, scores, groups)
    return float(per_group[0]) if valid.any() else math.nan


def gauc(labels: np.ndarray, scores: np.ndarray, users: np.ndarray) -> float:
    """Per-user AUC weighted by the user's sample count; NaN when no user has both classes.

    NaN too when a score is NaN.

    Args:
        labels: [N] labels; values above 0.5 are positives.
        scores: [N] scores.
        users: [N] user ids (any hashable numpy dtype).

    Raises:
        ValueError: the arrays are not 1-D of one length, or a label is NaN.
        TypeError: labels or scores are not numbers.

    Examples:
        Each user's items are ranked right, though the two users' scores overlap: the AUC
        over all samples is 0.75, the GAUC 1. User ``c`` has no negative and does not count.

        >>> labels = np.array([0, 1, 0, 1, 1])
        >>> scores = np.array([0.1, 0.2, 0.8, 0.9, 0.3])
        >>> gauc(labels, scores, np.array(["a", "a", "b", "b", "c"]))
        1.0
        >>> auc(labels[:4], scores[:4])
        0.75
    """
    labels, scores = _vectors(labels=labels, scores=scores)
    users = np.asarray(users)
    if users.shape != labels.shape:
        raise ValueError(f"users must be [N] as labels are {list(labels.shape)}, not {list(users.shape)}")
    if len(labels) == 0 or np.isnan(scores).any():
        return math.nan
    _, groups = np.unique(users, return_inverse=True)
    per_group, counts, valid = _grouped_auc(labels, scores, groups)
    if not valid.any():
        return math.nan
    return float(np.average(per_group[valid], weights=counts[valid]))


def logloss(labels: np.ndarray, probs: np.ndarray) -> float:
    """Mean binary cross-entropy of probabilities clipped away from 0 and 1; NaN if empty.

    NaN too when a probability is NaN.

    Raises:
        ValueError: the arrays are not 1-D of one length, a label is NaN, or a probability is
            outside [0, 1] (a logit, say, which clipping would silently score).
        TypeError: labels or probs are not numbers.

    Examples:
        >>> round(logloss(np.array([1, 0]), np.array([0.9, 0.2])), 4)
        0.1643
    """
    labels, probs = _vectors(labels=labels, probs=probs)
    outside = np.flatnonzero((probs < 0) | (probs > 1))
    if len(outside):
        raise ValueError(f"probs must be probabilities in [0, 1], not {probs[outside[0]]} (at {outside[0]})")
    if len(labels) == 0:
        return math.nan
    y = (labels > 0.5).astype(np.float64)
    p = np.clip(probs.astype(np.float64), _LOGLOSS_EPS, 1.0 - _LOGLOSS_EPS)
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p)))


def _vectors(**arrays: np.ndarray) -> list[np.ndarray]:
    """The named arrays as 1-D numeric arrays of one length, the first being the labels.

    Raises:
        ValueError: one is not 1-D, their lengths differ, or a label is NaN.
        TypeError: one is not numbers (or booleans).
    """
    out = []
    for name, values in arrays.items():
        array = np.asarray(values)
        if array.ndim != 1:
            raise ValueError(f"{name} must be a 1-D array [N], not of shape {list(array.shape)}")
        if array.dtype != bool and not np.issubdtype(array.dtype, np.number):
            raise TypeError(f"{name} must be numbers, not {array.dtype}")
        out.append(array)
    lengths = {name: len(a) for name, a in zip(arrays, out, strict=True)}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"arrays of different lengths: {lengths}")
    nan = np.flatnonzero(np.isnan(out[0].astype(np.float64)))
    if len(nan):
        raise ValueError(f"{next(iter(arrays))} hold NaN (at {nan[0]}): a label must be a number")
    return out


def _grouped_auc(
    labels: np.ndarray, scores: np.ndarray, groups: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """AUC within each group from tie-averaged ranks, vectorised over groups.

    Args:
        labels: [N] labels; values above 0.5 are positives.
        scores: [N] scores.
        groups: [N] dense group numbers 0..G-1.

    Returns:
        (auc [G], sample count [G], valid [G]); valid groups have both classes, and the
        AUC of an invalid group is NaN.
    """
    n_groups = int(groups.max()) + 1 if len(groups) else 0
    if n_groups == 0:
        empty = np.zeros(0)
        return empty, empty, empty.astype(bool)
    order = np.lexsort((scores, groups))
    g, s = groups[order], scores[order]
    y = (labels[order] > 0.5).astype(np.float64)
    new_group = np.r_[True, g[1:] != g[:-1]]
    group_start = np.flatnonzero(new_group)
    first_of_group = np.repeat(group_start, np.diff(np.r_[group_start, len(g)]))
    # A run of equal scores inside a group shares the mean of the ranks it spans.
    run_start = np.flatnonzero(new_group | np.r_[True, s[1:] != s[:-1]])
    run_len = np.diff(np.r_[run_start, len(g)])
    mean_rank = np.repeat(run_start + (run_len - 1) / 2.0, run_len) - first_of_group + 1.0
    counts = np.bincount(g, minlength=n_groups).astype(np.float64)
    pos = np.bincount(g, weights=y, minlength=n_groups)
    neg = counts - pos
    rank_sum = np.bincount(g, weights=mean_rank * y, minlength=n_groups)
    valid = (pos > 0) & (neg > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_group = (rank_sum - pos * (pos + 1) / 2.0) / (pos * neg)
    return np.where(valid, per_group, np.nan), counts, valid


@dataclass(frozen=True, slots=True)
class MicroBatchMetrics:
    """Prequential metrics of one micro-batch, scored before the learner trained on it.

    ``known_auc`` is the AUC over samples whose target item was seen before, separating
    ranking quality from cold start; ``known_samples`` counts them. ``novelty_auc`` scores
    "the target item is new to the model" alone: near 0.5 means the negative sampler gives
    no novelty shortcut; far above it, the AUC would measure the sampler, not the model.
    ``tell_history_auc`` and ``tell_category_auc`` (`TELLS`) score "the target is in
    the user's history" and "the share of the history in the target's category" alone: on
    real impressions near 0.5 (a little above: users do return to what they know); well
    above it, the negative sampler gives the label away.
    """

    samples: int
    positives: int
    auc: float
    gauc: float
    logloss: float
    known_auc: float
    known_samples: int
    novelty_auc: float
    mean_prediction: float = math.nan  # calibration: against the observed positive rate
    positive_rate: float = math.nan
    tell_history_auc: float = math.nan  # NaN: computed without the match features
    tell_category_auc: float = math.nan

    @classmethod
    def compute(
        cls,
        labels: np.ndarray,
        probs: np.ndarray,
        users: np.ndarray,
        known_mask: np.ndarray,
        features: Mapping[str, np.ndarray] | None = None,
    ) -> MicroBatchMetrics:
        """Compute every metric for one scored batch.

        Args:
            labels: [N] 0/1 labels.
            probs: [N] predicted probabilities.
            users: [N] user ids.
            known_mask: [N] bool, whether each target item was seen before.
            features: The batch's match features by name, for the tells; None: NaN tells.
        """
        labels, probs = np.asarray(labels), np.asarray(probs)
        known = np.asarray(known_mask, dtype=bool)
        tells = {k: math.nan if features is None else auc(labels, features[f]) for k, f in TELLS.items()}
        return cls(
            samples=len(labels),
            positives=int((labels > 0.5).sum()),
            auc=auc(labels, probs),
            gauc=gauc(labels, probs, users),
            logloss=logloss(labels, probs),
            known_auc=auc(labels[known], probs[known]),
            known_samples=int(known.sum()),
            novelty_auc=auc(labels, (~known).astype(np.float64)),
            mean_prediction=float(probs.mean()) if len(probs) else math.nan,
            positive_rate=float((labels > 0.5).mean()) if len(labels) else math.nan,
            tell_history_auc=tells["tell_history_auc"],
            tell_category_auc=tells["tell_category_auc"],
        )
