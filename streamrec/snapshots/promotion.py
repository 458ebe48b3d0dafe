r"""The serving pointer: which snapshot version serving loads, and the history of promotions.

``<root>/serving/CURRENT`` holds one version name (``v000007\n``). It is replaced atomically
(written beside, fsynced, ``os.replace``, directory fsynced), so a reader sees the old name or
the new one, never a torn file; serving needs no lock to read it. ``<root>/serving/history.jsonl``
is append-only JSON lines (time, action ``promote`` or ``rollback``, version, previous,
reason): every version it names was once served, so retention never deletes it.

Operators promote and roll back while a learner writes, so pointer updates take their own
short ``flock`` (``<root>/serving/.lock``), never the learner's. The history line is written
before the pointer moves: a crash between the two leaves a version recorded (and so kept)
that was not served, never one served and unrecorded.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import orjson

from streamrec.errors import SnapshotError
from streamrec.fileio import fsync_path
from streamrec.snapshots.directory import describe_os_error, parse_version

logger = logging.getLogger(__name__)

SERVING = "serving"
CURRENT = "CURRENT"
HISTORY = "history.jsonl"
_LOCK = ".lock"
_CURRENT_TMP = ".CURRENT.tmp"  # one name: writers hold the lock, so a crash leaves one at most
_MODE = 0o644  # serving may run as another user
# How long an update waits for another one (a promote verifying a large snapshot) to finish.
LOCK_TIMEOUT_S = 60.0
_LOCK_POLL_S = 0.05


@dataclass(frozen=True)
class ServingEvent:
    """One line of the serving history."""

    time: str
    action: str  # "promote" or "rollback"
    version: int  # the version served from then on
    previous: int | None  # the version served before, None at the first promotion
    reason: str


class ServingPointer:
    """``<root>/serving/``: the CURRENT pointer, its history and its lock."""

    def __init__(self, root: Path) -> None:
        """The pointer of the snapshot directory ``root`` (nothing is created until written)."""
        self.dir = Path(root) / SERVING
        self.current_path = self.dir / CURRENT
        self.history_path = self.dir / HISTORY

    def current(self) -> int | None:
        """The version serving should load, or None when nothing was ever promoted.

        Raises:
            SnapshotError: CURRENT exists but is unreadable or names no version.
        """
        try:
            text = self.current_path.read_text()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise SnapshotError(f"cannot read {self.current_path}: {describe_os_error(exc)}") from exc
        version = parse_version(text)
        if version is None:
            raise SnapshotError(
                f"{self.current_path} names no version ({text.strip()[:40]!r}): promote one again"
            )
        return version

    def history(self) -> list[ServingEvent]:
        """Every promotion and rollback, oldest first (a line torn by a crash is skipped)."""
        try:
            raw = self.history_path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise SnapshotError(f"cannot read {self.history_path}: {describe_os_error(exc)}") from exc
        events = []
        for number, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                events.append(ServingEvent(**orjson.loads(line)))
            except (orjson.JSONDecodeError, TypeError) as exc:
                logger.warning("skipping unreadable serving history line path=%s line=%d error=%s",
                               self.history_path, number, exc)
        return events

    @contextmanager
    def locked(self, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
        """Hold the pointer's lock (waiting up to ``timeout_s`` for another update).

        Raises:
            SnapshotError: the lock cannot be created, or another update held it too long.
        """
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.dir / _LOCK, os.O_RDWR | os.O_CREAT, _MODE)
        except OSError as exc:
            raise SnapshotError(f"cannot create {self.dir / _LOCK}: {describe_os_error(exc)}") from exc
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise SnapshotError(
                            f"{self.dir / _LOCK} stayed locked for {timeout_s:.0f}s: another "
                            "promote, rollback or prune is running; try again when it ends"
                        ) from None
                    time.sleep(_LOCK_POLL_S)
            yield
        finally:
            os.close(fd)  # releases the flock

    def record(self, action: str, version: int, previous: int | None, reason: str) -> ServingEvent:
        """Append one event to the history, durably. Call it holding :meth:`locked`."""
        event = ServingEvent(
            time=datetime.now(UTC).isoformat(timespec="milliseconds"),
            action=action, version=version, previous=previous, reason=reason,
        )
        line = orjson.dumps(asdict(event)) + b"\n"
        try:
            fd = os.open(self.history_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, _MODE)
            try:
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":  # a line torn by a crash
                    line = b"\n" + line
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise SnapshotError(f"cannot write {self.history_path}: {describe_os_error(exc)}") from exc
        return event

    def point(self, version: int) -> None:
        """Swap CURRENT to ``version`` atomically. Call it holding :meth:`locked`."""
        tmp = self.dir / _CURRENT_TMP
        try:
            with tmp.open("wb") as fh:
                fh.write(f"v{version:06d}\n".encode())
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, _MODE)
            os.replace(tmp, self.current_path)
            fsync_path(self.dir)
        except OSError as exc:
            raise SnapshotError(f"cannot write {self.current_path}: {describe_os_error(exc)}") from exc

    def promoted(self) -> list[int]:
        """Every version ever served, in order of first promotion (CURRENT's included)."""
        seen = dict.fromkeys(e.version for e in self.history())
        current = self.current()
        if current is not None:
            seen.setdefault(current)
        return list(seen)

    def rollback_candidates(self, current: int) -> list[int]:
        """The versions served before ``current``, most recent first (a rollback takes the first valid one).

        A promote pushes a version; a rollback pops back to its target.
        """
        stack: list[int] = []
        for event in self.history():
            if event.action == "rollback" and event.version in stack:
                del stack[stack.index(event.version) + 1:]
            elif not stack or stack[-1] != event.version:
                stack.append(event.version)
        if current in stack:  # the history may run past CURRENT after a crash between the two
            del stack[len(stack) - 1 - stack[::-1].index(current):]
        return [v for v in reversed(stack) if v != current]
