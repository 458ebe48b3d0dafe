"""Tests for ``streamrec.learner.columns``: columns, hashing per table, right-aligned padding,
truncation, take.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from streamrec.config import ModelConfig
from streamrec.features import BUILTIN
from streamrec.learner.columns import SampleColumns, encode
from streamrec.learner.hashing import bucketize
from streamrec.samples import BUILTIN_FIELDS, Sample, builtin_columns
from tests.support import small_tables

CFG = ModelConfig.model_validate({"tables": small_tables(1024, 64), "sequence_length": 3})


def _sample(n: int, label: int = 1, user: str = "u1", **kw: Any) -> Sample:
    fields: dict[str, Any] = {
        "sample_id": f"s{n}",
        "user_id": user,
        "ts": 1_000 + n,
        "item_id": "target",
        "category_id": "tc",
        "label": label,
        "seq_items": tuple(f"i{k}" for k in range(n)),
        "seq_categories": tuple(f"c{k}" for k in range(n)),
    }
    return Sample(**{**fields, **kw})


def test_columns_keep_sample_order() -> None:
    batch = SampleColumns.from_samples([_sample(2), _sample(1, label=0, user="u2")])
    assert len(batch) == 2 and batch.sample_ids == ["s2", "s1"]
    assert batch.user_ids.tolist() == ["u1", "u2"] and batch.ts.tolist() == [1002, 1001]
    assert batch.label.dtype == np.float32 and batch.label.tolist() == [1.0, 0.0]
    assert batch.seq_lengths.tolist() == [2, 1]
    assert batch.sequence_ids("item") == ["i0", "i1", "i0"]
    assert batch.sequence_ids("category") == ["c0", "c1", "c0"]
    assert batch.target_ids("category") == ["tc", "tc"] and batch.target_ids("user") == ["u1", "u2"]


def test_item_and_category_are_features_keyed_by_name_as_any_other() -> None:
    batch = SampleColumns.from_samples([_sample(2), _sample(1, label=0, features={"device": "ios"})])
    assert list(batch.features) == ["item", "category", "device"]  # the default schema's first
    item = batch.features["item"]
    assert (item.kind, item.target, item.sequence) == ("id", ["target", "target"], ["i0", "i1", "i0"])
    assert batch.features["category"].target == batch.target_ids("category") == ["tc", "tc"]
    assert not any(hasattr(batch, a) for a in ("item_ids", "category_ids", "seq_items", "seq_categories"))


def test_the_samples_own_fields_are_the_default_schemas_features() -> None:
    names = [f.name for f in BUILTIN]
    assert list(builtin_columns([])) == list(BUILTIN_FIELDS) == names
    sample = _sample(2)
    for name, (target, along) in BUILTIN_FIELDS.items():
        assert builtin_columns([sample])[name] == ([getattr(sample, target)], [getattr(sample, along)])


def test_a_declared_feature_named_as_a_builtin_is_refused() -> None:
    with pytest.raises(ValueError, match="'item' is the sample's own field"):
        SampleColumns.from_samples([_sample(1, features={"item": "x"})])


def test_ids_of_a_feature_without_them_are_refused_by_name() -> None:
    batch = SampleColumns.from_samples([_sample(1, features={"device": "ios", "price": 3.0})])
    with pytest.raises(ValueError, match="'price' has no ids"):
        batch.target_ids("price")
    with pytest.raises(ValueError, match="'device' has no such side"):
        batch.sequence_ids("device")
    with pytest.raises(KeyError):
        batch.target_ids("brand")


def test_long_sequence_keeps_latest_short_one_is_left_padded() -> None:
    encoded = encode(SampleColumns.from_samples([_sample(5), _sample(1, label=0), _sample(0)]), CFG)
    items, cats = encoded.sequences["item"], encoded.sequences["category"]
    assert items.shape == (3, 3) and items.dtype == np.int64
    assert items[0].tolist() == bucketize(["i2", "i3", "i4"], 1024).tolist()
    assert cats[0].tolist() == bucketize(["c2", "c3", "c4"], 64).tolist()
    assert items[1].tolist() == [0, 0, *bucketize(["i0"], 1024).tolist()]
    assert cats[1].tolist() == [0, 0, *bucketize(["c0"], 64).tolist()]
    assert items[2].tolist() == [0, 0, 0]


def test_targets_and_labels_are_encoded_per_table() -> None:
    encoded = encode(SampleColumns.from_samples([_sample(2), _sample(2, label=0, user="u2")]), CFG)
    assert len(encoded) == 2 and encoded.context == {}
    assert encoded.targets["item"].tolist() == bucketize(["target"] * 2, 1024).tolist()
    assert encoded.targets["category"].tolist() == bucketize(["tc"] * 2, 64).tolist()
    assert encoded.label.tolist() == [1.0, 0.0]


def test_a_user_table_is_a_context_feature() -> None:
    tables = [*small_tables(1024, 64), {"name": "user", "feature": "user", "rows": 128, "dim": 4}]
    cfg = ModelConfig.model_validate({"tables": tables, "sequence_length": 3})
    encoded = encode(SampleColumns.from_samples([_sample(1, user="a"), _sample(1, user="b")]), cfg)
    assert encoded.context["user"].tolist() == bucketize(["a", "b"], 128).tolist()
    assert set(encoded.sequences) == {"item", "category"}


def test_take_selects_rows_in_order() -> None:
    encoded = encode(SampleColumns.from_samples([_sample(1), _sample(2), _sample(3)]), CFG)
    sub = encoded.take([2, 0])
    np.testing.assert_array_equal(sub.sequences["item"], encoded.sequences["item"][[2, 0]])
    np.testing.assert_array_equal(sub.targets["category"], encoded.targets["category"][[2, 0]])
    np.testing.assert_array_equal(sub.label, encoded.label[[2, 0]])


def test_empty_batch() -> None:
    encoded = encode(SampleColumns.from_samples([]), CFG)
    assert len(encoded) == 0 and encoded.sequences["item"].shape == (0, 3)


def test_mismatched_sequence_lengths_rejected() -> None:
    with pytest.raises(ValueError, match="categories"):
        SampleColumns.from_samples([_sample(2, seq_categories=("c0",))])


def test_the_first_mismatched_sample_is_named() -> None:
    samples = [_sample(1), _sample(3, seq_categories=("c0",)), _sample(2, seq_categories=())]
    with pytest.raises(ValueError, match=r"sample s3: 3 seq_items but 1 seq_categories"):
        SampleColumns.from_samples(samples)


def test_sequences_flatten_sample_after_sample() -> None:
    batch = SampleColumns.from_samples([_sample(2), _sample(0), _sample(3, seq_items=("x", "y", "z"))])
    assert batch.seq_lengths.tolist() == [2, 0, 3]
    assert batch.sequence_ids("item") == ["i0", "i1", "x", "y", "z"]
    assert batch.sequence_ids("category") == ["c0", "c1", "c0", "c1", "c2"]


def test_table_configs_are_checked() -> None:
    with pytest.raises(ValueError, match="unique"):
        ModelConfig.model_validate({"tables": [*small_tables(), *small_tables()]})
    with pytest.raises(ValueError, match="behaviour table"):
        ModelConfig.model_validate({"tables": [{"name": "user", "feature": "user", "rows": 8}]})


@pytest.mark.parametrize("label", [None, 2, 0.5, float("nan")])
def test_a_label_other_than_0_or_1_never_becomes_a_column(label: Any) -> None:
    """Decoding refuses such samples; a Sample built in code is refused here too, because a
    NaN label (from ``None``) once turned every weight of the model to NaN.
    """
    with pytest.raises(ValueError, match="label must be 0 or 1"):
        SampleColumns.from_samples([_sample(1), _sample(2, label=label)])


@pytest.mark.parametrize(
    ("samples", "words"),
    [
        ([{"sample_id": "e1"}], "samples holds Sample values, not dict (at 0)"),
        (iter([Sample("e1", "u1", 1, "i1", "c1", 1, (), ())]),
         "samples is a sequence (a list), not list_iterator"),
        ("e1", "samples is a sequence (a list), not str"),
    ],
)
def test_what_is_not_a_sequence_of_samples_is_refused_naming_it(samples: Any, words: str) -> None:
    # Found by the Python-API tour: dicts raised AttributeError "'dict' object has no attribute
    # 'item_id'" six frames deep, a generator "object of type 'list_iterator' has no len()".
    with pytest.raises(TypeError, match=re.escape(words)):
        SampleColumns.from_samples(samples)
