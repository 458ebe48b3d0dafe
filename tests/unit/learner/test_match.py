"""Causal match features: what a sample's own history says about its target."""

from __future__ import annotations

import numpy as np

from streamrec.learner.columns import SampleColumns
from streamrec.learner.match import MATCH_FEATURES, match_features
from streamrec.samples import Sample


def sample(n: int, item: str, category: str, seq: tuple[tuple[str, str], ...]) -> Sample:
    items = tuple(i for i, _ in seq)
    categories = tuple(c for _, c in seq)
    return Sample(f"s{n}", "u", n, item, category, n % 2, items, categories)


def test_each_feature_reads_the_samples_own_history() -> None:
    batch = SampleColumns.from_samples([
        sample(0, "a", "x", (("a", "x"), ("b", "y"), ("c", "x"), ("d", "z"))),  # in history, 2/4 x
        sample(1, "e", "y", (("a", "x"), ("b", "y"))),  # not in history, 1/2 y
        sample(2, "f", "w", (("g", "x"),)),  # nothing in common
        sample(3, "a", "x", ()),  # empty history: a's item elsewhere must not count
    ])
    f = match_features(batch)
    assert list(f) == list(MATCH_FEATURES)
    assert f["target_in_history"].tolist() == [1, 0, 0, 0]
    assert np.allclose(f["category_share"], [0.5, 0.5, 0.0, 0.0])
    assert f["category_hit"].tolist() == [1, 1, 0, 0]
    assert f["empty_history"].tolist() == [0, 0, 0, 1]
    assert all(v.dtype == np.float64 and v.shape == (4,) for v in f.values())


def test_an_empty_batch_has_empty_features() -> None:
    f = match_features(SampleColumns.from_samples([]))
    assert all(len(v) == 0 for v in f.values())


def test_a_batch_without_any_history_reads_all_empty() -> None:
    # every sample a user's first: no behaviour at all in the batch (a live micro-batch can be)
    f = match_features(SampleColumns.from_samples([sample(0, "a", "x", ()), sample(1, "b", "y", ())]))
    assert f["empty_history"].tolist() == [1, 1] and f["category_share"].tolist() == [0, 0]
    assert all(v.dtype == np.float64 for v in f.values())
