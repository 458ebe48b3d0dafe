"""A version's files: tensors in safetensors and the manifest, written sealed and read verified.

Each tensor group is one ``<group>.safetensors`` (``model``, ``optimizer``, ``state``) and the
manifest is ``manifest.json`` with its own checksum in ``manifest.sha256``. Nothing is pickled,
so reading a version runs no code. Files are world-readable and fsynced when written: a serving
process under another user can load them, and a rename after them publishes whole files.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import load_file, save_file

from streamrec.errors import InvalidSnapshot
from streamrec.fileio import sha256_file
from streamrec.snapshots.delta import contiguous
from streamrec.snapshots.directory import describe_os_error
from streamrec.snapshots.manifest import MANIFEST, MANIFEST_SUM, SnapshotManifest, checksum_line

FILE_MODE = 0o644  # world-readable: serving may run as another user (safetensors writes 0600)
DIR_MODE = 0o755

Tensors = dict[str, dict[str, np.ndarray]]


def seal(path: Path) -> None:
    """Make a written file world-readable and durable."""
    os.chmod(path, FILE_MODE)
    with path.open("rb+") as fh:
        os.fsync(fh.fileno())


def _write_file(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    seal(path)


def write_tensor_files(directory: Path, tensors: Tensors) -> dict[str, str]:
    """One sealed ``<group>.safetensors`` per tensor group in ``directory``.

    Their sha256 by file name, as a manifest's ``files``.
    """
    files = {}
    for group, arrays in tensors.items():
        target = directory / f"{group}.safetensors"
        save_file({k: contiguous(v) for k, v in arrays.items()}, str(target))
        seal(target)
        files[target.name] = sha256_file(target)
    return files


def write_manifest_files(directory: Path, manifest: SnapshotManifest) -> None:
    """``manifest.json`` and its checksum file in ``directory``, sealed."""
    raw = manifest.to_json()
    _write_file(directory / MANIFEST, raw)
    _write_file(directory / MANIFEST_SUM, checksum_line(raw))


def verify_tensor_files(directory: Path, manifest: SnapshotManifest) -> None:
    """Check each file ``manifest`` lists in ``directory`` against its checksum and as safetensors.

    Raises:
        InvalidSnapshot: naming the file that is missing, unreadable, changed or not safetensors.
    """
    for name, digest in manifest.files.items():
        path = directory / name
        try:
            matches = sha256_file(path) == digest
        except FileNotFoundError as exc:
            raise InvalidSnapshot(f"{path} is missing") from exc
        except OSError as exc:
            raise InvalidSnapshot(f"cannot read {path}: {describe_os_error(exc)}") from exc
        if not matches:
            raise InvalidSnapshot(f"{path} does not match its checksum")
        try:  # the header only: a file that is not safetensors fails here, never executes
            with safe_open(str(path), framework="np"):
                pass
        except (OSError, SafetensorError) as exc:
            raise InvalidSnapshot(f"{path} is not a safetensors file: {exc}") from exc


def read_tensor_files(directory: Path, manifest: SnapshotManifest) -> Tensors:
    """The tensor groups ``manifest`` lists, read from ``directory`` (checksums not verified here).

    Raises:
        InvalidSnapshot: a file cannot be read as safetensors.
    """
    tensors = {}
    for name in manifest.files:
        path = directory / name
        try:
            tensors[name.removesuffix(".safetensors")] = load_file(str(path))
        except (OSError, SafetensorError) as exc:
            raise InvalidSnapshot(f"cannot read {path}: {describe_os_error(exc)}") from exc
    return tensors


def non_finite(arrays: Mapping[str, np.ndarray]) -> list[str]:
    """The keys of the floating-point arrays holding NaN or infinite values."""
    return [
        key for key, array in arrays.items()
        if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all()
    ]


def named(keys: list[str]) -> str:
    """A few keys by name, and how many more."""
    return ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


def finite_problem(tensors: Mapping[str, Mapping[str, np.ndarray]]) -> str | None:
    """Why a version's state is not loaded (NaN or infinite values, which are never written), or None.

    A file edited by hand or by another tool and resealed: a learner would resume it, an export
    serve it, answering NaN scores. Resume and export refuse it (`streamrec.learner.snapshotting`),
    and `snapshot verify`, `list` and `show` say so.
    """
    bad = non_finite({f"{group}/{key}": v for group, arrays in tensors.items() for key, v in arrays.items()})
    if not bad:
        return None
    return (
        f"its state holds NaN or infinite values in {named(bad)}, which streamrec never writes (a file "
        "edited, then resealed): it is not loaded; delete the version, or restore it from a backup"
    )
