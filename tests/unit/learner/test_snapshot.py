"""SnapshotStore: versioned atomic writes, checksums, requests; no pickle anywhere."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from streamrec.errors import SnapshotError
from streamrec.kafka.records import Position
from streamrec.learner.snapshot import SnapshotManifest, SnapshotStore


def write(store: SnapshotStore, value: float = 1.0, **fields: object) -> SnapshotManifest:
    tensors: dict[str, dict[str, np.ndarray]] = {
        "model": {"w": np.full(3, value, np.float32)}, "state": {"k": np.arange(4)}
    }
    args = {"micro_batches": 2, "samples_trained": 10, "positions": (Position("t", 0, 7),)} | fields
    return store.write(tensors, **args)


def test_versions_increase_and_round_trip(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    assert store.latest() is None and store.versions() == []
    first = write(store, 1.0, metrics={"auc": float("nan"), "gauc": 0.6})
    second = write(store, 2.0)
    assert (first.version, second.version) == (1, 2)
    assert store.latest() == second
    manifest, tensors = store.load(1)
    assert manifest == store.manifest(1)
    assert manifest.positions == (Position("t", 0, 7),)
    assert manifest.metrics == {"auc": None, "gauc": 0.6}  # NaN is stored as null
    np.testing.assert_array_equal(tensors["model"]["w"], np.ones(3, np.float32))
    assert sorted(p.name for p in store.path(1).iterdir()) == [
        "manifest.json", "model.safetensors", "state.safetensors",
    ]


def test_tampered_or_missing_files_are_refused(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    write(store)
    weights = store.path(1) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x00")
    with pytest.raises(SnapshotError, match="checksum"):
        store.load(1)
    weights.unlink()
    with pytest.raises(SnapshotError, match="missing"):
        store.load(1)


def test_leftover_temporary_directories_are_not_snapshots(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    (tmp_path / ".tmp-crashed").mkdir()
    (tmp_path / "v000009-partial").mkdir()
    assert store.versions() == []
    assert write(store).version == 1


def test_requests_are_filed_answered_and_found(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    request = store.request()
    assert store.pending_requests() == [request]
    write(store, request_id=request)
    store.done(request)
    assert store.pending_requests() == []
    found = store.find_request(request)
    assert found is not None and found.version == 1
    assert store.find_request("other") is None
