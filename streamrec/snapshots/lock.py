"""One learner per snapshot directory: an exclusive ``flock`` on ``<root>/.lock``.

Two learners on one directory would split the group's partitions and interleave versions,
silently losing data. The kernel drops a ``flock`` when its holder's file is closed, however
the process ends (kill -9 included), so a lock is never left stale. The file also names its
holder (pid, host, start time) so the refused learner can say whom it met. ``flock`` is
per open file, so a second lock in the same process is refused too. It does not reach across
hosts on NFS: keep snapshot directories on a local or lock-aware file system.

`exclusive` is the short, waiting ``flock`` of the operations that take turns instead (pointer
updates, export rebuilds).
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType

import orjson

from streamrec.errors import SnapshotDirError, SnapshotError, SnapshotInUse
from streamrec.snapshots.directory import describe_os_error

logger = logging.getLogger(__name__)

LOCK = ".lock"
_MODE = 0o644  # readable by anyone, so an operator can see who holds the directory
# How often a wait for `exclusive` tries again: short, as the holders it waits for are.
_POLL_S = 0.05


@contextmanager
def exclusive(
    path: Path, timeout_s: float, busy: Callable[[int], str], waiting: Callable[[int], None] | None = None
) -> Iterator[int]:
    """Hold an exclusive ``flock`` on ``path`` (created if needed), waiting for another holder.

    Yields the lock file's descriptor (a holder may note itself in it); ``waiting(fd)`` is
    called once if another holds it at first. Released at the end of the block, or by the
    kernel however the process ends.

    Raises:
        SnapshotError: the file cannot be created, or ``busy(fd)`` when another kept it past
            ``timeout_s``.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, _MODE)
    except OSError as exc:
        raise SnapshotError(f"cannot create {path}: {describe_os_error(exc)}") from exc
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise SnapshotError(busy(fd)) from None
                if waiting is not None:
                    waiting(fd)
                    waiting = None
                time.sleep(_POLL_S)
        yield fd
    finally:
        os.close(fd)  # releases the flock


class SnapshotLock:
    """Exclusive hold on a snapshot directory for one process's learner."""

    def __init__(self, root: Path) -> None:
        """Lock ``root`` (which must exist) through ``root/.lock``.

        Nothing happens until `acquire`.
        """
        self.root = Path(root)
        self.path = self.root / LOCK
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock now."""
        return self._fd is not None

    def acquire(self) -> SnapshotLock:
        """Take the lock without waiting and record the holder.

        Raises:
            SnapshotInUse: another process (or runner) holds it; the message names the holder.
            SnapshotDirError: the lock file cannot be created or locked.
        """
        if self._fd is not None:
            return self
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, _MODE)
        except OSError as exc:
            cause = describe_os_error(exc)
            raise SnapshotDirError(f"cannot create lock file {self.path}: {cause}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise SnapshotInUse(self._in_use_message()) from None
        except OSError as exc:
            os.close(fd)
            cause = describe_os_error(exc)
            raise SnapshotDirError(f"cannot lock {self.path}: {cause}") from exc
        self._fd = fd
        self._write_holder(fd)
        logger.info("locked snapshot directory path=%s pid=%d", self.root, os.getpid())
        return self

    def release(self) -> None:
        """Drop the lock (and the holder note); a no-op when not held."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)  # no stale holder note for whoever reads it next
        except OSError as exc:
            logger.warning("cannot clear lock file path=%s error=%s", self.path, exc)
        finally:
            os.close(fd)  # closing the last descriptor releases the flock
        logger.info("released snapshot directory path=%s", self.root)

    def holder(self) -> dict[str, object]:
        """What the lock file says about its holder (empty when unreadable or blank)."""
        try:
            doc = orjson.loads(self.path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return {}
        return doc if isinstance(doc, dict) else {}

    def _write_holder(self, fd: int) -> None:
        note = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, orjson.dumps(note) + b"\n", 0)
            os.fchmod(fd, _MODE)
        except OSError as exc:  # the lock itself holds; only the note for others is missing
            logger.warning("cannot write lock holder path=%s error=%s", self.path, exc)

    def _in_use_message(self) -> str:
        note = self.holder()
        who = (
            f"pid {note.get('pid')} on host {note.get('host')} since {note.get('since')}"
            if note else "another process (it has not named itself yet)"
        )
        return (
            f"snapshot directory {self.root} is in use by {who}: "
            "is another `streamrec learner run` running?"
        )

    def __enter__(self) -> SnapshotLock:
        """Acquire for a ``with`` block."""
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Release at the end of the block."""
        self.release()
