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


def test_the_features_are_the_string_comparisons_on_random_batches() -> None:
    # ids compare by their first positions along the sequences: exactly string equality, with
    # targets absent from every sequence, repeated targets and ids shared by items and categories
    rng = np.random.default_rng(7)
    for trial in range(20):
        ids = [f"{'x' if trial % 2 else ''}{i}" for i in range(6)]
        samples = []
        for n in range(int(rng.integers(1, 12))):
            seq = tuple((str(rng.choice(ids)), str(rng.choice(ids))) for _ in range(int(rng.integers(0, 7))))
            samples.append(sample(n, str(rng.choice([*ids, "new"])), str(rng.choice(ids)), seq))
        f = match_features(SampleColumns.from_samples(samples))
        for i, s in enumerate(samples):
            same_item = sum(x == s.item_id for x in s.seq_items)
            same_cat = sum(c == s.category_id for c in s.seq_categories)
            assert f["target_in_history"][i] == (same_item > 0)
            assert f["category_share"][i] == (same_cat / len(s.seq_items) if s.seq_items else 0.0)
            assert f["empty_history"][i] == (not s.seq_items)


def test_the_learners_encoding_and_the_match_features_find_the_positions_once() -> None:
    batch = SampleColumns.from_samples(
        [sample(0, "a", "x", (("a", "x"), ("b", "y"))), sample(1, "b", "y", ())]
    )
    first = batch.sequence_positions("item")
    match_features(batch)
    assert batch.sequence_positions("item") is first
    assert first[0] == {"a": 0, "b": 1} and first[1].tolist() == [0, 1]
