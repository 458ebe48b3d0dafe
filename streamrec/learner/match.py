"""Causal match features.

What each sample's own history (strictly earlier than it) says about its target, computed from a
`SampleColumns` alone.

They are the simplest signals a ranker can use and the first a negative sampler can leak: a
sampler that never draws from the user's history makes ``target_in_history`` a label tell.
One place defines them, keyed by name (see `MATCH_FEATURES`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np

from streamrec.learner.columns import SampleColumns


def _sums(batch: SampleColumns) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[B] per sample: behaviours whose item is the target's, whose category is, and all.

    Ids compare by their first positions along the sequences (`SampleColumns.sequence_positions`,
    which the learner's encoding reads too): exactly string equality, 3x faster than comparing
    the strings as numpy arrays (measured on MovieLens micro-batches, 10.6 against 32 ms a 2,500).
    """
    lengths = batch.seq_lengths
    rows = np.repeat(np.arange(len(batch), dtype=np.int64), lengths)
    n = len(batch)
    hits = []
    for name in ("item", "category"):
        first, at = batch.sequence_positions(name)
        targets = batch.target_ids(name)
        # A target in no sequence is at -1: no behaviour's position.
        target_at = np.fromiter(map(first.get, targets, itertools.repeat(-1)), np.int64, count=n)
        # as float: over no behaviours at all (every history empty) bincount gives int64
        hits.append(np.bincount(rows, weights=at == target_at[rows], minlength=n).astype(np.float64))
    return hits[0], hits[1], lengths.astype(np.float64)


def _share(hits: np.ndarray, total: np.ndarray) -> np.ndarray:
    return np.divide(hits, total, out=np.zeros_like(hits), where=total > 0)


#: Each feature from (item hits, category hits, history length), all float64 [B].
MATCH_FEATURES: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]] = {
    "target_in_history": lambda items, cats, n: (items > 0).astype(np.float64),
    "category_share": lambda items, cats, n: _share(cats, n),
    "category_hit": lambda items, cats, n: (cats > 0).astype(np.float64),
    "empty_history": lambda items, cats, n: (n == 0).astype(np.float64),
}


def match_features(batch: SampleColumns) -> dict[str, np.ndarray]:
    """Every match feature of ``batch``, name -> float64 [B], in `MATCH_FEATURES` order."""
    if len(batch) == 0:
        return {name: np.zeros(0) for name in MATCH_FEATURES}
    sums = _sums(batch)
    return {name: f(*sums) for name, f in MATCH_FEATURES.items()}
