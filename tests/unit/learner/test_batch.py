"""Tests for ``streamrec.learner.batch``: hashing, right-aligned padding, truncation, take."""

from __future__ import annotations

import numpy as np
import pytest

from streamrec.config import ModelConfig
from streamrec.learner.batch import Batch
from streamrec.learner.hashing import bucketize
from streamrec.samples import Sample

CFG = ModelConfig(item_buckets=1024, category_buckets=64, sequence_length=3)


def _sample(n: int, label: int = 1, user: str = "u1", **kw: object) -> Sample:
    items = tuple(f"i{k}" for k in range(n))
    cats = tuple(f"c{k}" for k in range(n))
    fields = dict(
        sample_id=f"s{n}",
        user_id=user,
        ts=1_000,
        item_id="target",
        category_id="tc",
        label=label,
        seq_items=items,
        seq_categories=cats,
    )
    fields.update(kw)
    return Sample(**fields)  # type: ignore[arg-type]  # test helper overrides typed fields


def test_long_sequence_keeps_latest_short_one_is_left_padded() -> None:
    batch = Batch.from_samples([_sample(5), _sample(1, label=0, user="u2"), _sample(0)], CFG)
    assert batch.seq_items.shape == (3, 3) and batch.seq_items.dtype == np.int64
    assert batch.seq_items[0].tolist() == bucketize(["i2", "i3", "i4"], 1024).tolist()
    assert batch.seq_categories[0].tolist() == bucketize(["c2", "c3", "c4"], 64).tolist()
    assert batch.seq_items[1].tolist() == [0, 0, *bucketize(["i0"], 1024).tolist()]
    assert batch.seq_categories[1].tolist() == [0, 0, *bucketize(["c0"], 64).tolist()]
    assert batch.seq_items[2].tolist() == [0, 0, 0]


def test_targets_labels_and_users() -> None:
    batch = Batch.from_samples([_sample(2), _sample(2, label=0, user="u2")], CFG)
    assert len(batch) == 2 and batch.sequence_length == 3
    assert batch.target_item.tolist() == bucketize(["target"] * 2, 1024).tolist()
    assert batch.target_category.tolist() == bucketize(["tc"] * 2, 64).tolist()
    assert batch.label.dtype == np.float32 and batch.label.tolist() == [1.0, 0.0]
    assert batch.user_ids.tolist() == ["u1", "u2"]


def test_take_selects_rows_in_order() -> None:
    samples = [_sample(1, user="a"), _sample(2, user="b"), _sample(3, user="c")]
    batch = Batch.from_samples(samples, CFG)
    sub = batch.take([2, 0])
    assert sub.user_ids.tolist() == ["c", "a"]
    np.testing.assert_array_equal(sub.seq_items, batch.seq_items[[2, 0]])
    np.testing.assert_array_equal(sub.target_category, batch.target_category[[2, 0]])


def test_empty_batch() -> None:
    batch = Batch.from_samples([], CFG)
    assert len(batch) == 0 and batch.seq_items.shape == (0, 3)


def test_mismatched_sequence_lengths_rejected() -> None:
    with pytest.raises(ValueError, match="categories"):
        Batch.from_samples([_sample(2, seq_categories=("c0",))], CFG)


def test_inconsistent_shapes_rejected() -> None:
    ok = Batch.from_samples([_sample(2)], CFG)
    with pytest.raises(ValueError, match="seq_categories"):
        Batch(
            ok.target_item,
            ok.target_category,
            ok.seq_items,
            ok.seq_categories[:, :2],
            ok.label,
            ok.user_ids,
        )
