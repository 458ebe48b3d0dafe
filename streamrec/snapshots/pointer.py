r"""The serving pointer: which snapshot version serving loads, and the history of its moves.

``<root>/serving/CURRENT`` holds one version name (``v000007\n``). It is replaced atomically
(written beside, fsynced, ``os.replace``, directory fsynced), so a reader sees the old name or
the new one, never a torn file; serving needs no lock to read it. ``<root>/serving/history.jsonl``
is appended JSON lines (time, action ``promote`` or ``rollback``, version, previous, reason;
``canary``, ``ab`` and ``end`` lines, with the plan in ``traffic``, start and end a traffic
plan, `streamrec.snapshots.traffic`, and name the version served throughout): every version it
names was once served. Past `COMPACT_LINES` prune compacts it (`ServingPointer.compact`).

Operators promote and roll back while a learner writes, so pointer updates take their own
short ``flock`` (``<root>/serving/.lock``), never the learner's. How it moves is
`streamrec.snapshots.promotion`'s.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import orjson

from streamrec.errors import SnapshotError
from streamrec.fileio import write_atomic
from streamrec.snapshots.directory import describe_os_error, parse_version
from streamrec.snapshots.history import compacted, replay
from streamrec.snapshots.lock import exclusive

logger = logging.getLogger(__name__)

SERVING = "serving"
CURRENT = "CURRENT"
HISTORY = "history.jsonl"
# Where compaction appends the lines it drops, in order: the whole record, never read back.
ARCHIVE = "history-archive.jsonl"
_LOCK = ".lock"
_MODE = 0o644  # serving may run as another user
# How long an update waits for another one (a promote verifying a large snapshot) to finish.
LOCK_TIMEOUT_S = 60.0
# A history longer than this is compacted at prune (`compact`): 2,000 lines are ~300 KB, read in
# ~10 ms, and four days of a gate promoting a snapshot every 3 minutes, so the file is rewritten
# about once in that time rather than at every prune.
COMPACT_LINES = 2_000
# The last lines a compaction keeps whatever they name: `tail` shows the recent moves as they were.
_TAIL_LINES = 20


@dataclass(frozen=True)
class ServingEvent:
    """One line of the serving history."""

    time: str
    action: str  # "promote" or "rollback"; "canary", "ab" or "end" for a traffic plan
    version: int  # the version served from then on
    previous: int | None  # the version served before, None at the first promotion
    reason: str
    traffic: str | None = None  # the traffic plan a canary or A/B event started or ended



class ServingPointer:
    """``<root>/serving/``: the CURRENT pointer, its history and its lock."""

    def __init__(self, root: Path) -> None:
        """The pointer of the snapshot directory ``root`` (nothing is created until written)."""
        self.dir = Path(root) / SERVING
        self.current_path = self.dir / CURRENT
        self.history_path = self.dir / HISTORY
        self.archive_path = self.dir / ARCHIVE

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
        return [event for _, event in self.lines()]

    def lines(self) -> list[tuple[bytes, ServingEvent]]:
        """`history`, each event with its line as written (a line torn by a crash is skipped).

        Raises:
            SnapshotError: the history cannot be read.
        """
        try:
            raw = self.history_path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise SnapshotError(f"cannot read {self.history_path}: {describe_os_error(exc)}") from exc
        lines = raw.splitlines()
        return [(line, event) for line, event in zip(lines, self._parse(lines), strict=True) if event]

    def _parse(self, lines: list[bytes]) -> list[ServingEvent | None]:
        """Each line's event; None for a blank one, or one torn by a crash (with a warning)."""
        events: list[ServingEvent | None] = []
        for number, line in enumerate(lines, 1):
            event = None
            if line.strip():
                try:
                    event = ServingEvent(**orjson.loads(line))
                except (orjson.JSONDecodeError, TypeError) as exc:
                    logger.warning("skipping unreadable serving history line path=%s line=%d error=%s",
                                   self.history_path, number, exc)
            events.append(event)
        return events

    @contextmanager
    def locked(self, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
        """Hold the pointer's lock (waiting up to ``timeout_s`` for another update).

        Raises:
            SnapshotError: the snapshot directory does not exist, the lock cannot be created, or
                another update held it too long.
        """
        require_root(self.dir.parent)  # a mistyped directory: nothing created under it
        try:
            self.dir.mkdir(exist_ok=True)
        except OSError as exc:
            raise SnapshotError(f"cannot create {self.dir}: {describe_os_error(exc)}") from exc
        lock = self.dir / _LOCK

        def busy(_: int) -> str:
            return (
                f"{lock} stayed locked for {timeout_s:.0f}s: another promote, rollback or prune "
                "is running; try again when it ends"
            )

        with exclusive(lock, timeout_s, busy):
            yield

    def record(
        self, action: str, version: int, previous: int | None, reason: str, traffic: str | None = None
    ) -> ServingEvent:
        """Append one event to the history, durably. Call it holding `locked`."""
        event = ServingEvent(
            time=datetime.now(UTC).isoformat(timespec="milliseconds"),
            action=action, version=version, previous=previous, reason=reason, traffic=traffic,
        )
        fields = {k: v for k, v in asdict(event).items() if k != "traffic" or v is not None}
        _append(self.history_path, orjson.dumps(fields) + b"\n")
        return event

    def compact(self, on_disk: set[int], lines: list[tuple[bytes, ServingEvent]] | None = None) -> int:
        """Drop the history's lines no reader needs about the versions ``on_disk``; how many were dropped.

        Only a history past `COMPACT_LINES`, with a readable CURRENT (one of ``on_disk``): the
        lines kept (`streamrec.snapshots.history.compacted`) give the same rollback order,
        served marks and retention for every version on disk, and the last lines as they were.
        The lines dropped are appended to `ARCHIVE` first (a crash before the replace may repeat
        them there), then the file is replaced atomically; a line torn by a crash goes with
        them. Call it holding `locked`, with the history's `lines` when read under it already.

        Raises:
            SnapshotError: the history cannot be read or written.
        """
        parsed = self.lines() if lines is None else lines
        try:
            current = self.current()
        except SnapshotError:
            return 0  # every version the history names is kept: nothing is dropped
        if len(parsed) <= COMPACT_LINES or current not in on_disk:
            return 0
        keep = compacted([event for _, event in parsed], on_disk, _TAIL_LINES)
        if keep is None:
            logger.info("serving history kept whole path=%s lines=%d", self.history_path, len(parsed))
            return 0
        kept = b"".join(parsed[n][0] + b"\n" for n in keep)  # each line as it was written
        dropped = set(range(len(parsed))) - set(keep)
        archived = self.archive_path.stat().st_size if self.archive_path.exists() else 0
        _append(self.archive_path, b"".join(parsed[n][0] + b"\n" for n in sorted(dropped)))
        try:
            write_atomic(self.history_path, kept, _MODE)
        except OSError as exc:
            with suppress(OSError):  # the history stays whole: its lines are not archived twice
                os.truncate(self.archive_path, archived)
            raise SnapshotError(f"cannot write {self.history_path}: {describe_os_error(exc)}") from exc
        logger.info("compacted serving history path=%s lines=%d kept=%d", self.history_path,
                    len(parsed), len(keep))
        return len(parsed) - len(keep)

    def point(self, version: int) -> None:
        """Swap CURRENT to ``version`` atomically. Call it holding `locked`."""
        try:
            write_atomic(self.current_path, f"v{version:06d}\n".encode(), _MODE)
        except OSError as exc:
            raise SnapshotError(f"cannot write {self.current_path}: {describe_os_error(exc)}") from exc

    def promoted(self, history: list[ServingEvent] | None = None) -> list[int]:
        """Every version ever served, in order of first promotion (CURRENT's included).

        An unreadable CURRENT adds nothing: the history, written before the pointer moves,
        names every version it ever named, so retention and listings go on without it.
        ``history``: `history`, when read already.
        """
        seen = dict.fromkeys(e.version for e in (self.history() if history is None else history))
        try:
            current = self.current()
        except SnapshotError:
            current = None
        if current is not None:
            seen.setdefault(current)
        return list(seen)

    def recently_served(self, history: list[ServingEvent] | None = None) -> list[int]:
        """The versions the history names, the one served most recently first, each once.

        ``history``: `history`, when read already.
        """
        events = self.history() if history is None else history
        return list(dict.fromkeys(e.version for e in reversed(events)))

    def retained(self, count: int, history: list[ServingEvent] | None = None) -> set[int]:
        """The served versions retention keeps: the current one and ``count`` of each kind before it.

        The ``count`` versions a rollback steps back to and the ``count`` served most recently
        before the current one. Every version the history names while CURRENT is unreadable.
        ``history``: `history`, when read already (the history is read once).
        """
        events = self.history() if history is None else history
        try:
            current = self.current()
        except SnapshotError:
            current = None
        if current is None:
            return set(self.promoted(events))
        before = self.rollback_candidates(current, events)[:count]
        return {current, *before, *self.recently_served(events)[: count + 1]}

    def rollback_candidates(
        self, current: int | None, history: list[ServingEvent] | None = None
    ) -> list[int]:
        """The versions served before ``current``, most recent first (a rollback takes the first valid one).

        A promote pushes a version; a rollback pops back to its target, so a version rolled
        back from is never among them. ``current`` None (an unreadable pointer): every
        version on the stack, the last served first. Each version once, where it was last
        served: promotions back and forth between two versions stacked each hundreds of times,
        and a server falling back, or a rollback, verified a damaged one that many times.
        """
        stack = replay(self.history() if history is None else history).versions
        if current in stack:  # the history may run past CURRENT after a crash between the two
            del stack[len(stack) - 1 - stack[::-1].index(current):]
        return [v for v in dict.fromkeys(reversed(stack)) if v != current]


def require_root(root: Path) -> None:
    """Raise unless the snapshot directory ``root`` exists.

    Raises:
        SnapshotError: it does not (a mistyped ``--snapshot-dir``, say).
    """
    if not Path(root).is_dir():
        raise SnapshotError(
            f"no snapshot directory {root}: check --snapshot-dir (STREAMREC_LEARNER__SNAPSHOT_DIR)"
        )


def _append(path: Path, data: bytes) -> None:
    """Append ``data`` (whole lines) to ``path`` durably, after a line torn by a crash, if any.

    Raises:
        SnapshotError: it cannot be written.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, _MODE)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":  # a line torn by a crash
                data = b"\n" + data
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise SnapshotError(f"cannot write {path}: {describe_os_error(exc)}") from exc
