"""A full snapshot of any version: a delta's chain applied, written as one plain version.

An outside reader of a delta version otherwise has to apply its chain itself (README, "Delta
snapshots"). The result is a version directory like any other (``manifest.json``, its
``manifest.sha256`` and one ``<group>.safetensors`` per tensor group), its manifest the
version's own but ``kind: full`` with no parent, so ``safetensors.numpy.load_file`` on each
file gives every tensor of the version. It is written beside ``out`` and renamed into place.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

from safetensors import SafetensorError

from streamrec.errors import SnapshotError, SnapshotWriteError
from streamrec.fileio import fsync_path
from streamrec.snapshots.directory import describe_os_error, temporary
from streamrec.snapshots.files import DIR_MODE, write_manifest_files, write_tensor_files
from streamrec.snapshots.manifest import SnapshotManifest
from streamrec.snapshots.store import SnapshotStore


def materialize(store: SnapshotStore, version: int, out: Path) -> SnapshotManifest:
    """Write ``version`` of ``store`` as a full snapshot in the new directory ``out``.

    Raises:
        InvalidSnapshot: the version or its chain failed a check.
        SnapshotError: ``out`` exists, or is inside the snapshot directory (a version named
            otherwise than its manifest, or a directory where an export goes).
        SnapshotWriteError: it could not be written (nothing is left behind).
    """
    out = Path(out)
    if out.exists():
        raise SnapshotError(f"{out} exists: give a directory that does not")
    if out.resolve().is_relative_to(store.root.resolve()):
        raise SnapshotError(
            f"{out} is inside the snapshot directory {store.root}, where it would be taken for a "
            "version (or an export) of its own: give a directory outside it"
        )
    manifest, tensors = store.load(version)
    tmp = temporary(out.parent)
    try:
        tmp.mkdir(parents=False)
        os.chmod(tmp, DIR_MODE)
        full = dataclasses.replace(
            manifest, files=write_tensor_files(tmp, tensors), kind="full", parent=None, delta={}
        )
        write_manifest_files(tmp, full)
        fsync_path(tmp)
        os.rename(tmp, out)
        fsync_path(out.parent)
    except (OSError, SafetensorError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SnapshotWriteError(f"cannot write {out}: {describe_os_error(exc)}") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return full


