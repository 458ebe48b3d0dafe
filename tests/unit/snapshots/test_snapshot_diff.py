"""diff_snapshots: fields, metrics, positions, config and per-tensor changes between versions."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from streamrec.cli import app
from streamrec.errors import InvalidSnapshot
from streamrec.kafka.records import Position
from streamrec.snapshots.diff import TensorDiff, diff_snapshots, flatten
from streamrec.snapshots.store import SnapshotStore


def test_diff_reports_what_changed(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    emb = np.arange(15, dtype=np.float32).reshape(5, 3)
    emb[4, 0] = np.nan
    moved = emb.copy()
    moved[1, 2] += 0.5
    moved[3] -= 2.0
    store.write(
        {"model": {"emb": emb, "bias": np.zeros(2, np.float32), "gone": np.ones(1)},
         "state": {"ids": np.arange(4), "flag": np.array([True, False])}},
        micro_batches=1, samples_trained=10, positions=(Position("t", 0, 5), Position("t", 1, 9)),
        metrics={"auc": 0.7, "logloss": 0.5}, config={"model": {"dim": 3, "lr": 0.1}},
    )
    store.write(
        {"model": {"emb": moved, "bias": np.zeros(3, np.float32), "new": np.ones(1)},
         "state": {"ids": np.array([0, 1, 7, 3]), "flag": np.array([True, True])}},
        micro_batches=4, samples_trained=40, positions=(Position("t", 0, 8), Position("t", 1, 9)),
        metrics={"auc": 0.75, "logloss": 0.5}, config={"model": {"dim": 3, "lr": 0.05}},
    )
    d = diff_snapshots(store, 1, 2)
    assert (d.a, d.b) == (1, 2)
    assert [(c.key, c.a, c.b) for c in d.fields if c.key != "created_at"] == [
        ("micro_batches", 1, 4), ("samples_trained", 10, 40),
    ]
    assert [(c.key, c.a, c.b) for c in d.metrics] == [("auc", 0.7, 0.75)]
    assert [(c.key, c.a, c.b) for c in d.positions] == [("t[0]", 5, 8)]
    assert [(c.key, c.a, c.b) for c in d.config] == [("model.lr", 0.1, 0.05)]
    by_name = {t.name: t for t in d.tensors}
    assert by_name["emb"] == TensorDiff(
        "model.safetensors", "emb", "changed", (5, 3), (5, 3), "float32",
        changed_rows=2, rows=5, max_abs_diff=2.0,
    )  # the NaN in row 4 is the same on both sides
    bias = by_name["bias"]
    assert (bias.status, bias.shape_a, bias.shape_b, bias.added_rows) == ("grown", (2,), (3,), 1)
    assert (by_name["gone"].status, by_name["new"].status) == ("removed", "added")
    assert (by_name["ids"].changed_rows, by_name["ids"].max_abs_diff) == (1, 5.0)
    assert (by_name["flag"].changed_rows, by_name["flag"].max_abs_diff) == (1, 1.0)
    assert [t.name for t in d.changed_tensors] == ["bias", "emb", "gone", "new", "flag", "ids"]
    same = diff_snapshots(store, 2, 2)
    assert same.changed_tensors == [] and same.metrics == [] and same.fields == []


def test_diff_refuses_an_invalid_version(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    store.write({"model": {"w": np.ones(2)}}, micro_batches=1, samples_trained=1, positions=())
    with pytest.raises(InvalidSnapshot, match="no snapshot version v000002"):
        diff_snapshots(store, 1, 2)


def test_flatten_uses_dotted_keys() -> None:
    assert flatten({"a": {"b": 1, "c": {"d": None}}, "e": {}, "f": [1]}) == {
        "a.b": 1, "a.c.d": None, "e": {}, "f": [1],
    }


@pytest.mark.parametrize("version", ["v000001", "1", 1.0])
def test_a_version_that_is_not_an_int_is_refused_naming_resolve(tmp_path: Path, version: object) -> None:
    # Found by the Python-API tour: diff_snapshots(store, "v000001", "2") and store.load("1") raised
    # "Unknown format code 'd' for object of type 'str'" from the version's name, seven frames deep.
    store = SnapshotStore(tmp_path)
    store.write({"model": {"w": np.ones(2)}}, micro_batches=1, samples_trained=1, positions=())
    with pytest.raises(TypeError, match=r"a snapshot version is an int \(SnapshotStore.resolve"):
        diff_snapshots(store, version, 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not " + re.escape(repr(version))):
        store.load(version)  # type: ignore[arg-type]
    assert store.load(np.int64(1))[0].version == 1  # type: ignore[arg-type]  # numpy's ints are ints


def test_a_table_that_only_grew_reports_rows_added_and_old_rows_changed(tmp_path: Path) -> None:
    # found by a tour: rows appended to an embedding table (new ids) made it "reshaped", with no
    # count of the old rows that training changed
    store = SnapshotStore(tmp_path)
    emb, ids = np.arange(15, dtype=np.float32).reshape(5, 3), np.arange(4)
    grown = np.concatenate([emb, np.full((3, 3), 9, np.float32)])
    grown[2, 1] += 0.25
    store.write({"model": {"emb": emb, "kept": emb, "wider": emb}, "state": {"ids": ids}},
                micro_batches=1, samples_trained=1, positions=())
    wider = np.zeros((5, 4), np.float32)
    store.write(
        {"model": {"emb": grown, "kept": np.concatenate([emb, emb[:1]]), "wider": wider},
         "state": {"ids": np.arange(6)}},
        micro_batches=2, samples_trained=2, positions=(),
    )
    by_name = {t.name: t for t in diff_snapshots(store, 1, 2).tensors}
    assert by_name["emb"] == TensorDiff(
        "model.safetensors", "emb", "grown", (5, 3), (8, 3), "float32",
        changed_rows=1, rows=5, max_abs_diff=0.25, added_rows=3,
    )
    kept = by_name["kept"]  # old rows untouched: none changed, one added
    assert (kept.status, kept.changed_rows, kept.rows, kept.added_rows) == ("grown", 0, 5, 1)
    assert kept.max_abs_diff is None
    ids_diff = by_name["ids"]  # a 1-D tensor grows by elements
    assert (ids_diff.status, ids_diff.changed_rows, ids_diff.rows, ids_diff.added_rows) == ("grown", 0, 4, 2)
    assert by_name["wider"].status == "reshaped"  # another axis changed: no rows to compare
    shrunk = diff_snapshots(store, 2, 1)
    assert {t.name: t.status for t in shrunk.tensors}["emb"] == "reshaped"  # rows removed: reshaped
    text = CliRunner().invoke(app, ["snapshot", "diff", "1", "2", "--snapshot-dir", str(tmp_path)]).stdout
    assert re.search(r"emb +│ grown +│ \(5, 3\) -> \(8, 3\) +│ 1/5, 3 added +│ 0.25", text), text
