"""Checks on a snapshot directory at learner start, so problems show before any training.

A learner that only finds out at its first snapshot that the directory is a file, read-only
or full has trained for nothing; one killed mid-write leaves a ``.tmp-*`` directory the size
of a snapshot. `prepare_directory` finds the first three and removes the last.
"""

from __future__ import annotations

import logging
import operator
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from streamrec.errors import SnapshotDirError
from streamrec.fileio import fsync_path
from streamrec.local.processes import pid_alive

logger = logging.getLogger(__name__)

TMP_PREFIX = ".tmp-"  # a snapshot being written; never a version


def version_name(version: int) -> str:
    """How a version is named on disk and on screen: ``v000007``.

    Raises:
        TypeError: ``version`` is not an int (a name such as ``"v000007"``: resolve it first).
    """
    try:
        number = operator.index(version)  # an int, numpy's included; not a str or a float
    except TypeError:
        raise TypeError(
            f"a snapshot version is an int (SnapshotStore.resolve(name) gives one), not {version!r}"
        ) from None
    return f"v{number:06d}"


def parse_version(name: str) -> int | None:
    """The version a ``v000007`` name stands for; None for any other name."""
    name = name.strip()
    if len(name) >= 7 and name[0] == "v" and name[1:].isdigit():
        return int(name[1:])
    return None
# Free space demanded at start, in snapshots: the next one and the one after, so a nearly full
# disk stops the learner before it trains rather than at a snapshot hours later.
SPARE_SNAPSHOTS = 2
# Beyond the tensor bytes: manifests, safetensors headers, file-system block rounding.
HEADROOM_BYTES = 1 << 20


def describe_os_error(exc: BaseException) -> str:
    """An OSError's cause and file without Python's decoration; other errors as they print."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror} ({exc.filename})" if exc.filename else exc.strerror
    return str(exc)


def free_bytes(path: Path) -> int:
    """Bytes free to an unprivileged user on the file system of ``path``."""
    return shutil.disk_usage(path).free


def ensure_directory(root: Path) -> None:
    """Create ``root`` if needed.

    Raises:
        SnapshotDirError: it is not a directory or cannot be created.
    """
    if root.exists() and not root.is_dir():
        raise SnapshotDirError(f"snapshot directory {root} is not a directory")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SnapshotDirError(
            f"cannot create snapshot directory {root}: {describe_os_error(exc)}"
        ) from exc


def prepare_directory(
    root: Path, snapshot_bytes: int, free: Callable[[Path], int] = free_bytes, export_bytes: int = 0
) -> None:
    """Check a snapshot directory at start; remove leftovers.

    Check that snapshots of ``snapshot_bytes`` (and their exports of ``export_bytes``) can be
    written in ``root``; remove leftovers.

    Call it holding the directory's lock: a temporary directory may otherwise be another
    learner's write in progress.

    Raises:
        SnapshotDirError: not a directory, not writable, or less free space than
            ``SPARE_SNAPSHOTS`` snapshots need (as ``free(root)`` reports it).
    """
    ensure_directory(root)
    remove_temporaries(root)
    _check_writable(root)
    _check_space(root, snapshot_bytes, free, export_bytes)


def temporary(parent: Path, what: str = "") -> Path:
    """A new temporary path in ``parent`` for a write of this process: ``.tmp-<pid>-<what><uuid>``.

    The pid tells `remove_temporaries` a write in progress in another process (an operator's
    ``snapshot export`` while the learner prunes) from one a crash left.
    """
    return parent / f"{TMP_PREFIX}{os.getpid()}-{what}{uuid.uuid4().hex}"


def remove_temporaries(root: Path) -> None:
    """Delete the ``.tmp-*`` directories of writes that never finished.

    Those of another process still running are writes in progress, and are left; this
    process's own writes are done by the time it calls this.
    """
    for tmp in root.glob(f"{TMP_PREFIX}*"):
        writer = _writer(tmp.name)
        if writer is not None and writer != os.getpid() and pid_alive(writer):
            continue
        logger.warning("removing an unfinished snapshot write path=%s", tmp)
        shutil.rmtree(tmp, ignore_errors=True)


def _writer(name: str) -> int | None:
    """The pid a `temporary` name holds; None for a name without one (an earlier release's)."""
    pid, dash, _ = name.removeprefix(TMP_PREFIX).partition("-")
    return int(pid) if dash and pid.isdigit() and int(pid) > 0 else None


def remove_tree(path: Path) -> None:
    """Delete a directory crash-safely.

    Renamed to a ``.tmp-`` name first, so it stops being a version in one atomic step, then
    removed. A crash in between leaves a temporary directory that `remove_temporaries`
    deletes at the next start.

    Raises:
        OSError: the rename failed (the directory is left as it was).
    """
    doomed = temporary(path.parent, f"deleted-{path.name}-")
    os.rename(path, doomed)
    fsync_path(path.parent)
    shutil.rmtree(doomed, ignore_errors=True)


def _check_writable(root: Path) -> None:
    probe = temporary(root, "probe-")
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as exc:
        raise SnapshotDirError(
            f"snapshot directory {root} is not writable: {describe_os_error(exc)}"
        ) from exc


def _check_space(root: Path, snapshot_bytes: int, free: Callable[[Path], int], export_bytes: int = 0) -> None:
    try:
        available = free(root)
    except OSError as exc:
        raise SnapshotDirError(
            f"cannot read the free space of {root}: {describe_os_error(exc)}"
        ) from exc
    need = SPARE_SNAPSHOTS * (snapshot_bytes + export_bytes) + HEADROOM_BYTES
    if available < need:
        exports = f" and their exports of {_mb(export_bytes)}" if export_bytes else ""
        raise SnapshotDirError(
            f"snapshot directory {root} has {_mb(available)} free but needs {_mb(need)} "
            f"({SPARE_SNAPSHOTS} snapshots of {_mb(snapshot_bytes)}{exports}): free some space"
        )


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"
