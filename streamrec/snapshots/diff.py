"""What changed between two snapshot versions: manifest fields, metrics, positions, config, tensors.

Both versions are loaded with every checksum verified. Per tensor: whether it was added, removed,
reshaped, grown, changed or is the same; for a changed tensor, how many rows differ (for a 1-D
tensor, elements) and the largest absolute difference, so an operator sees at a glance which
embedding rows a stretch of training touched before promoting it. A tensor that only grew (rows
appended, the other axes and the dtype the same: a table given new ids) is compared the same way
on its old rows, with the rows added counted apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from streamrec.snapshots.store import SnapshotManifest, SnapshotStore

_FIELDS = ("created_at", "micro_batches", "samples_trained", "request_id")


@dataclass(frozen=True)
class ValueChange:
    """A value that differs between A and B (None where one side lacks it)."""

    key: str
    a: Any
    b: Any


@dataclass(frozen=True)
class TensorDiff:
    """One tensor of one file compared between A and B."""

    file: str  # the tensor group, as in the manifest: ``model.safetensors``
    name: str
    status: str  # "same", "changed", "grown", "reshaped", "added" or "removed"
    shape_a: tuple[int, ...] | None
    shape_b: tuple[int, ...] | None
    dtype: str
    changed_rows: int | None = None  # rows (first axis) with any difference; None unless changed or grown
    rows: int | None = None  # the rows compared: A's, for a grown tensor
    max_abs_diff: float | None = None  # NaN against a number counts as infinite; None: no row differs
    added_rows: int | None = None  # rows B appended; None unless grown


@dataclass(frozen=True)
class SnapshotDiff:
    """Every difference between versions ``a`` and ``b``."""

    a: int
    b: int
    fields: list[ValueChange]
    metrics: list[ValueChange]
    positions: list[ValueChange]  # key ``topic[partition]``, values the next offsets
    config: list[ValueChange]  # dotted keys, ``model.embedding_dim``
    tensors: list[TensorDiff]  # every tensor, the same ones included

    @property
    def changed_tensors(self) -> list[TensorDiff]:
        """The tensors that are not the same."""
        return [t for t in self.tensors if t.status != "same"]


def diff_snapshots(store: SnapshotStore, a: int, b: int) -> SnapshotDiff:
    """Compare two versions of ``store``.

    Raises:
        InvalidSnapshot: either version is missing or fails a check.
    """
    manifest_a, tensors_a = store.load(a)
    manifest_b, tensors_b = store.load(b)
    return SnapshotDiff(
        a=a,
        b=b,
        fields=_changes(
            {k: getattr(manifest_a, k) for k in _FIELDS}, {k: getattr(manifest_b, k) for k in _FIELDS}
        ),
        metrics=_changes(manifest_a.metrics, manifest_b.metrics),
        positions=_changes(_positions(manifest_a), _positions(manifest_b)),
        config=_changes(flatten(manifest_a.config), flatten(manifest_b.config)),
        tensors=[
            _tensor(f"{group}.safetensors", name, tensors_a.get(group, {}).get(name),
                    tensors_b.get(group, {}).get(name))
            for group in sorted(tensors_a.keys() | tensors_b.keys())
            for name in sorted(tensors_a.get(group, {}).keys() | tensors_b.get(group, {}).keys())
        ],
    )


def _changes(a: dict[str, Any], b: dict[str, Any]) -> list[ValueChange]:
    return [ValueChange(k, a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]


def _positions(manifest: SnapshotManifest) -> dict[str, int]:
    return {f"{p.topic}[{p.partition}]": p.offset for p in manifest.positions}


def flatten(doc: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one dict of dotted keys (``model.embedding_dim``)."""
    flat: dict[str, Any] = {}
    for key, value in doc.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _tensor(file: str, name: str, a: np.ndarray | None, b: np.ndarray | None) -> TensorDiff:
    shape_a = None if a is None else tuple(a.shape)
    shape_b = None if b is None else tuple(b.shape)
    dtype = str((a if a is not None else b).dtype)  # type: ignore[union-attr]  # one side exists
    if a is None or b is None:
        return TensorDiff(file, name, "added" if a is None else "removed", shape_a, shape_b, dtype)
    if _grew(a, b):
        changed_rows, max_abs_diff = _row_changes(a, b[: a.shape[0]])
        return TensorDiff(
            file, name, "grown", shape_a, shape_b, dtype, changed_rows=changed_rows, rows=a.shape[0],
            max_abs_diff=max_abs_diff, added_rows=b.shape[0] - a.shape[0],
        )
    if a.shape != b.shape or a.dtype != b.dtype:
        return TensorDiff(file, name, "reshaped", shape_a, shape_b, f"{a.dtype}->{b.dtype}")
    changed_rows, max_abs_diff = _row_changes(a, b)
    if not changed_rows:
        return TensorDiff(file, name, "same", shape_a, shape_b, dtype)
    return TensorDiff(
        file, name, "changed", shape_a, shape_b, dtype,
        changed_rows=changed_rows, rows=a.shape[0] if a.ndim else 1, max_abs_diff=max_abs_diff,
    )


def _grew(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``b`` is ``a`` with rows appended: more rows, the other axes and the dtype the same."""
    return (
        a.dtype == b.dtype and a.ndim == b.ndim and a.ndim > 0
        and b.shape[0] > a.shape[0] and a.shape[1:] == b.shape[1:]
    )


def _differs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise inequality, NaN equal to NaN."""
    if np.issubdtype(a.dtype, np.inexact):
        return (a != b) & ~(np.isnan(a) & np.isnan(b))
    return np.asarray(a != b)


def _row_changes(a: np.ndarray, b: np.ndarray) -> tuple[int, float | None]:
    """How many rows (first axis; a 0-d array is one) of same-shaped ``a`` and ``b`` differ, and by most.

    The largest difference is None when none differs, 1 for booleans, inf where one side is NaN.
    """
    differs = _differs(a, b)
    if not differs.any():
        return 0, None
    changed_rows = int(differs.reshape(a.shape[0] if a.ndim else 1, -1).any(axis=1).sum())
    if a.dtype == np.bool_:
        return changed_rows, 1.0
    gap = np.abs(a[differs].astype(np.float64) - b[differs].astype(np.float64))
    return changed_rows, float(np.nan_to_num(gap, nan=np.inf).max())
