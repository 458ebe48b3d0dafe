"""Durable, checksummed files: what snapshots and exports are written with."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fsync_path(path: Path) -> None:
    """Flush a file or a directory to disk (a directory's ``fsync`` makes renames in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` by ``data`` so a reader sees the old bytes or the new, never a torn file.

    Written beside (``.<name>.tmp``), fsynced, renamed over, the directory fsynced. Callers
    that may race hold a lock: the temporary name is one per target.

    Raises:
        OSError: the write, rename or sync failed (the old file is left as it was).
    """
    with atomic_file(path, mode) as fh:
        fh.write(data)


@contextmanager
def atomic_file(path: Path, mode: int = 0o644) -> Iterator[BinaryIO]:
    """A file to write that replaces ``path`` when the block ends, as `write_atomic` does.

    For data written as it comes rather than held whole. An exception in the block leaves
    ``path`` as it was and removes the temporary file.

    Raises:
        OSError: the write, rename or sync failed (the old file is left as it was).
    """
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with tmp.open("wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)
