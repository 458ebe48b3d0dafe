"""Delta snapshots: a version that holds only what changed since its parent version.

Between two snapshots a learner touches few embedding rows, yet a full snapshot rewrites every
table and both Adam moments of each. A delta stores, per tensor file:

* a tensor whose rows (first axis) changed in part, as the changed rows under its own name plus
  their indices under ``<name>/__rows__`` (int64); rows added by table growth count as changed,
  and the manifest records the new row count (``rows``) so growth and shrinking are replayed;
* a tensor that is new, changed in dtype or trailing shape, 0-d, or cheaper whole than as rows,
  whole under its own name;
* nothing for a tensor that is bitwise the same (compared as raw bytes, so NaN and -0.0 are exact);
* the names of tensors the parent has and this version lacks (``removed``).

A tensor file of the parent that this version lacks altogether is simply not in its manifest.
Applying the deltas of a chain in order to its full snapshot gives back, bit for bit, the
tensors that were written.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from streamrec.errors import InvalidSnapshot

ROWS_SUFFIX = "/__rows__"  # the indices of a row-patched tensor ``name`` are ``name/__rows__``
_INDEX = np.dtype(np.int64)

Arrays = dict[str, np.ndarray]
Tensors = dict[str, Arrays]
# Per tensor file of a delta: {"rows": {name: row count after patching}, "removed": [names]}.
DeltaSpec = dict[str, dict[str, Any]]


def make_delta(parent: Tensors, tensors: Tensors) -> tuple[Tensors, DeltaSpec]:
    """What to write for ``tensors`` as a delta on ``parent``: the tensor files and the spec.

    Every group of ``tensors`` gets a file (empty when nothing in it changed), so the groups of
    the result are those the delta names.
    """
    files: Tensors = {}
    spec: DeltaSpec = {}
    for group, arrays in tensors.items():
        files[group], group_spec = _group_delta(parent.get(group, {}), arrays)
        if group_spec:
            spec[group] = group_spec
    return files, spec


def contiguous(a: np.ndarray) -> np.ndarray:
    """``a`` in C order, 0-d arrays kept 0-d (``np.ascontiguousarray`` makes them 1-d)."""
    return a if a.flags.c_contiguous else np.array(a, order="C")


def delta_allowed(tensors: Tensors) -> bool:
    """Whether every tensor name can be told apart from the row indices a delta adds."""
    return not any(name.endswith(ROWS_SUFFIX) for arrays in tensors.values() for name in arrays)


def _group_delta(parent: Arrays, arrays: Arrays) -> tuple[Arrays, dict[str, Any]]:
    out: Arrays = {}
    rows: dict[str, int] = {}
    for name, new in arrays.items():
        new = contiguous(new)
        old = parent.get(name)
        index = None if old is None else changed_rows(old, new)
        if old is not None and (_same(old, new) if index is None else _unchanged(old, new, index)):
            continue  # bitwise the same: the parent's stands
        if index is not None and index.size * (_INDEX.itemsize + _row_nbytes(new)) < new.nbytes:
            out[name] = new[index]
            out[name + ROWS_SUFFIX] = index
            rows[name] = int(new.shape[0])
        else:
            out[name] = new
    removed = sorted(parent.keys() - arrays.keys())
    spec: dict[str, Any] = {}
    if rows:
        spec["rows"] = rows
    if removed:
        spec["removed"] = removed
    return out, spec


def _unchanged(old: np.ndarray, new: np.ndarray, index: np.ndarray) -> bool:
    return index.size == 0 and old.shape == new.shape


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equality: same dtype, shape and bytes."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _row_nbytes(a: np.ndarray) -> int:
    return a.itemsize * int(np.prod(a.shape[1:], dtype=np.int64))


def changed_rows(old: np.ndarray, new: np.ndarray) -> np.ndarray | None:
    """Indices of the rows of ``new`` that differ bitwise from ``old`` or that ``old`` lacks.

    None when the two cannot be patched row by row (dtype, rank or trailing shape differ).
    """
    if new.ndim == 0 or old.dtype != new.dtype or old.shape[1:] != new.shape[1:]:
        return None
    common = min(old.shape[0], new.shape[0])
    grown = np.arange(common, new.shape[0], dtype=_INDEX)
    if common == 0 or _row_nbytes(new) == 0:
        return grown
    differs = (_words(old[:common]) != _words(new[:common])).any(axis=1)
    return np.concatenate([np.flatnonzero(differs).astype(_INDEX), grown])


def _words(a: np.ndarray) -> np.ndarray:
    """Each row's raw bytes, as the widest unsigned words that divide a row (fewer compares)."""
    raw = contiguous(a).reshape(a.shape[0], -1).view(np.uint8)
    width = next(w for w in (8, 4, 2, 1) if raw.shape[1] % w == 0)
    return raw.view(f"<u{width}")


def apply_delta(base: Tensors, files: Tensors, spec: DeltaSpec, where: str) -> Tensors:
    """The tensors of a delta version.

    ``base`` (its parent's, not modified) patched by the delta's tensor ``files`` and ``spec``.

    Raises:
        InvalidSnapshot: the delta does not fit its parent (``where`` names the version).
    """
    for group in spec:
        if group not in files:
            raise InvalidSnapshot(f"{where}: the delta describes {group}, which it has no file for")
    return {
        group: _apply_group(base.get(group, {}), arrays, spec.get(group, {}), f"{where}/{group}")
        for group, arrays in files.items()
    }


def _apply_group(base: Arrays, arrays: Arrays, spec: dict[str, Any], where: str) -> Arrays:
    rows: dict[str, int] = spec.get("rows", {})
    removed = set(spec.get("removed", ()))
    out = {name: array for name, array in base.items() if name not in removed}
    for name, array in arrays.items():
        if name.endswith(ROWS_SUFFIX):
            if name.removesuffix(ROWS_SUFFIX) not in rows:
                raise InvalidSnapshot(f"{where}: row indices {name} for a tensor the delta does not patch")
            continue
        if name in rows:
            out[name] = _patch(base.get(name), array, arrays.get(name + ROWS_SUFFIX), rows[name],
                               f"{where}:{name}")
        else:
            out[name] = array
    missing = [name for name in rows if name not in arrays]
    if missing:
        raise InvalidSnapshot(f"{where}: the delta patches {', '.join(missing)} but holds no rows for it")
    return out


def _patch(
    old: np.ndarray | None, values: np.ndarray, index: np.ndarray | None, count: int, where: str
) -> np.ndarray:
    if old is None or index is None:
        raise InvalidSnapshot(f"{where}: a row patch without its parent tensor or its row indices")
    shape = (count, *old.shape[1:])
    fits = values.dtype == old.dtype and values.shape[1:] == old.shape[1:] and index.ndim == 1
    fits = fits and index.shape[0] == values.shape[0]
    if not fits or (index.size and not 0 <= index.min() <= index.max() < count):
        raise InvalidSnapshot(f"{where}: the row patch does not fit its parent tensor {old.dtype}{old.shape}")
    out = np.empty(shape, old.dtype)
    keep = min(count, old.shape[0])
    out[:keep] = old[:keep]
    out[index] = values
    # Rows past the parent's that the patch left unset would be garbage: a writer never does so.
    if count > old.shape[0] and not np.isin(np.arange(old.shape[0], count), index).all():
        raise InvalidSnapshot(f"{where}: the row patch leaves grown rows unset")
    return out
