r"""Promotion: which snapshot version serving loads, how it moves, and what retention keeps.

``<root>/serving/CURRENT`` holds one version name (``v000007\n``). It is replaced atomically
(written beside, fsynced, ``os.replace``, directory fsynced), so a reader sees the old name or
the new one, never a torn file; serving needs no lock to read it. ``<root>/serving/history.jsonl``
is append-only JSON lines (time, action ``promote`` or ``rollback``, version, previous,
reason; ``canary``, ``ab`` and ``end`` lines, with the plan in ``traffic``, start and end a
traffic plan, `streamrec.snapshots.traffic`, and name the version served throughout): every
version it names was once served; retention keeps the served one and the last few before it
(`prune`).

Operators promote and roll back while a learner writes, so pointer updates take their own
short ``flock`` (``<root>/serving/.lock``), never the learner's. The history line is written
before the pointer moves: a crash between the two leaves a version recorded (and so kept)
that was not served, never one served and unrecorded.

`promote` and `rollback` move the pointer only to a version whose every checksum
(and its export's) holds; `prune` deletes old versions but never the served one or the
last ones served before it. `SnapshotStore` offers all three as methods.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import orjson

from streamrec.errors import InvalidSnapshot, NotServable, SnapshotError
from streamrec.fileio import write_atomic
from streamrec.snapshots.directory import describe_os_error, parse_version, remove_tree, version_name
from streamrec.snapshots.exports import check_export, export_dir, refuse_unservable
from streamrec.snapshots.lock import exclusive
from streamrec.snapshots.manifest import SnapshotManifest
from streamrec.snapshots.traffic import TrafficPlan, read_plan, remove_plan

logger = logging.getLogger(__name__)

SERVING = "serving"
CURRENT = "CURRENT"
HISTORY = "history.jsonl"
_LOCK = ".lock"
_MODE = 0o644  # serving may run as another user
# How long an update waits for another one (a promote verifying a large snapshot) to finish.
LOCK_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ServingEvent:
    """One line of the serving history."""

    time: str
    action: str  # "promote" or "rollback"; "canary", "ab" or "end" for a traffic plan
    version: int  # the version served from then on
    previous: int | None  # the version served before, None at the first promotion
    reason: str
    traffic: str | None = None  # the traffic plan a canary or A/B event started or ended


# Events that move CURRENT; the others ("canary", "ab", "end") start or end a traffic plan and
# leave it where it was (their version is the one served throughout).
POINTER_ACTIONS = ("promote", "rollback")


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
        line = orjson.dumps(fields) + b"\n"
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
        """Swap CURRENT to ``version`` atomically. Call it holding `locked`."""
        try:
            write_atomic(self.current_path, f"v{version:06d}\n".encode(), _MODE)
        except OSError as exc:
            raise SnapshotError(f"cannot write {self.current_path}: {describe_os_error(exc)}") from exc

    def promoted(self) -> list[int]:
        """Every version ever served, in order of first promotion (CURRENT's included).

        An unreadable CURRENT adds nothing: the history, written before the pointer moves,
        names every version it ever named, so retention and listings go on without it.
        """
        seen = dict.fromkeys(e.version for e in self.history())
        try:
            current = self.current()
        except SnapshotError:
            current = None
        if current is not None:
            seen.setdefault(current)
        return list(seen)

    def recently_served(self) -> list[int]:
        """The versions the history names, the one served most recently first, each once."""
        return list(dict.fromkeys(e.version for e in reversed(self.history())))

    def retained(self, count: int) -> set[int]:
        """The served versions retention keeps: the current one and ``count`` of each kind before it.

        The ``count`` versions a rollback steps back to and the ``count`` served most recently
        before the current one. Every version the history names while CURRENT is unreadable.
        """
        try:
            current = self.current()
        except SnapshotError:
            current = None
        if current is None:
            return set(self.promoted())
        before = self.rollback_candidates(current)[:count]
        return {current, *before, *self.recently_served()[: count + 1]}

    def rollback_candidates(self, current: int | None) -> list[int]:
        """The versions served before ``current``, most recent first (a rollback takes the first valid one).

        A promote pushes a version; a rollback pops back to its target, so a version rolled
        back from is never among them. ``current`` None (an unreadable pointer): every
        version on the stack, the last served first. Each version once, where it was last
        served: promotions back and forth between two versions stacked each hundreds of times,
        and a server falling back, or a rollback, verified a damaged one that many times.
        """
        stack: list[int] = []
        for event in self.history():
            if event.action not in POINTER_ACTIONS:
                continue
            if event.action == "rollback" and event.version in stack:
                del stack[stack.index(event.version) + 1:]
            elif not stack or stack[-1] != event.version:
                stack.append(event.version)
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


# Why `streamrec serve` would not load a version's export (serving's serve_problem), or None.
ServeCheck = Callable[[int], str | None]

# Builds a version's missing export (serving's build_missing_export): its path, or None when the
# version holds no model to export; raises SnapshotError when it cannot.
BuildExport = Callable[[int], Path | None]


class Versions(Protocol):
    """What promotion needs of a snapshot directory (`SnapshotStore`)."""

    root: Path
    serving: ServingPointer

    def versions(self) -> list[int]:
        """Version directories, oldest first."""

    def path(self, version: int) -> Path:
        """Directory of a version."""

    def manifest(self, version: int) -> SnapshotManifest:
        """One manifest, its own checksum verified."""

    def verify(self, version: int) -> SnapshotManifest:
        """Every checksum of a version and its chain verified; its manifest."""

    def validate(self, version: int) -> str | None:
        """Why a version is invalid, or None."""

    def state_problem(self, version: int) -> str | None:
        """Why a verified version's state is not loaded (NaN or infinite values), or None."""


def promote(
    store: Versions,
    version: int,
    reason: str = "manual",
    build_export: BuildExport | None = None,
    serve_check: ServeCheck | None = None,
) -> SnapshotManifest:
    """Verify every checksum of ``version`` and of its export, then point serving at it.

    A damaged export is refused. A missing one is built first by ``build_export(version)``
    when it is given (serving's promotions give it); without a builder, or when the version
    holds no model to export (the builder returns None), it is accepted. An export that
    ``serve_check(version)`` says `streamrec serve` would not load (a learner's own contract)
    is refused; the command leaves the check out for a team's own server (``--own-server``).

    Promoting the version already served, with no canary or A/B test running, changes nothing
    and records nothing: the history is the pointer's moves (`rollback` steps back through them).

    Raises:
        InvalidSnapshot: the version or its export is missing or failed a check (the message
            names the file); the pointer is unchanged.
        NotServable: ``serve_check`` says `streamrec serve` would not load its export.
        SnapshotError: the pointer or its history cannot be written.
    """
    with store.serving.locked():
        plan = read_plan(store.root)
        if plan is not None and version not in plan.versions():
            raise SnapshotError(
                f"a {plan.kind} runs ({plan.describe()}): promote one of its versions, which ends it, "
                "or end it first (`streamrec snapshot rollback`)"
            )
        manifest = store.verify(version)
        _require_finite(store, version)
        _require_export(store, version, build_export)
        _require_servable(store, version, serve_check)
        previous = _current_or_none(store.serving)
        if previous == version and plan is None:
            logger.info("promote changed nothing version=%s: it is served already", manifest.name)
            return manifest
        store.serving.record("promote", version, previous, reason)
        store.serving.point(version)
        if plan is not None:  # a null arm follows CURRENT: safe to end after the pointer moved
            end_traffic(store, plan, f"{manifest.name} promoted: {reason}")
    logger.info("promoted snapshot version=%s previous=%s reason=%s", manifest.name,
                previous and version_name(previous), reason)
    return manifest


def _require_finite(store: Versions, version: int) -> None:
    """Raise if a verified ``version``'s state holds NaN or infinity (`SnapshotStore.state_problem`).

    streamrec never writes such state, and resume and the export refuse it; an export built
    before the state was edited would still be served.

    Raises:
        InvalidSnapshot: naming the arrays.
    """
    problem = store.state_problem(version)
    if problem is not None:
        raise InvalidSnapshot(f"{version_name(version)} is not served: {problem}")


def _require_export(store: Versions, version: int, build_export: BuildExport | None) -> None:
    """Raise unless ``version``'s export is whole (built first if missing and a builder is given).

    A store given no builder accepts a missing export.
    """
    check = check_export(store.root, version)
    if check.missing:
        if build_export is None or build_export(version) is None:
            return  # no builder, or nothing to export: a store without a model
        logger.info("built the missing export of version=%s before serving it", version_name(version))
        check = check_export(store.root, version)
    refuse_unservable(check)


def _require_servable(store: Versions, version: int, serve_check: ServeCheck | None) -> None:
    """Raise if ``serve_check`` says `streamrec serve` would not load ``version``'s export.

    Raises:
        NotServable: naming why, and how to promote it for a server of the team's own.
    """
    problem = serve_check(version) if serve_check is not None else None
    if problem is not None:
        raise NotServable(
            f"{problem}; a server of your own that scores it so and follows "
            f"{store.serving.current_path} takes it with `streamrec snapshot promote {version} --own-server`"
        )


def _servable_problem(
    store: Versions, version: int, build_export: BuildExport | None, serve_check: ServeCheck | None
) -> str | None:
    """Why serving cannot take ``version`` (the snapshot or its export), or None."""
    problem = store.validate(version)
    if problem is not None:
        return problem
    try:
        _require_finite(store, version)
        _require_export(store, version, build_export)
        _require_servable(store, version, serve_check)
    except SnapshotError as exc:
        return str(exc)
    return None


def rollback(
    store: Versions,
    reason: str = "manual",
    build_export: BuildExport | None = None,
    serve_check: ServeCheck | None = None,
) -> int:
    """Point serving back at the version promoted before the current one.

    Point serving back at the version promoted before the current one, skipping any that
    is no longer valid or whose export is damaged or would not load (see `promote` for
    ``build_export`` and ``serve_check``); returns it.

    While a canary or an A/B test runs, it ends that instead (every user back on the served
    version, which stays) and returns the served version.

    Raises:
        SnapshotError: nothing is promoted, or no earlier promoted version is valid.
    """
    with store.serving.locked():
        current = store.serving.current()
        if current is None:
            raise SnapshotError(f"no version is promoted in {store.root}: nothing to roll back")
        plan = read_plan(store.root)
        if plan is not None:
            end_traffic(store, plan, f"rolled back: {reason}")
            return current
        skipped = []
        for version in store.serving.rollback_candidates(current):
            problem = _servable_problem(store, version, build_export, serve_check)
            if problem is None:
                store.serving.record("rollback", version, current, reason)
                store.serving.point(version)
                logger.info("rolled back serving version=%s from=%s", version_name(version),
                            version_name(current))
                return version
            logger.warning("not rolling back to invalid version=%s reason=%s",
                           version_name(version), problem)
            skipped.append(version_name(version))
    note = f" (invalid: {', '.join(skipped)})" if skipped else ""
    raise SnapshotError(
        f"no earlier promoted valid version to roll back to from {version_name(current)}{note}: "
        "promote one with `streamrec snapshot promote VERSION`"
    )


def prune(store: Versions, keep_last: int) -> list[int]:
    """Delete all but the newest ``keep_last`` versions and their exports (0 keeps all).

    Returns the versions deleted.

    Never deleted: the current one, the ``keep_last`` versions a rollback steps back to and
    the ``keep_last`` served most recently (`ServingPointer.retained`: every version ever
    promoted would grow without bound where every snapshot is promoted), the newest valid one
    (what a learner resumes from), a traffic plan's, and every version the chain of a kept
    delta needs. Each is
    renamed to a ``.tmp-`` name before it is removed, so a crash leaves no half-deleted
    version, only a temporary removed at the next start.

    Raises:
        SnapshotError: a negative ``keep_last``, an unreadable pointer, or a failed rename.
    """
    if keep_last < 0:
        raise SnapshotError(f"keep_last must be 0 (keep all) or more, not {keep_last}")
    if keep_last == 0:
        return []
    deleted = []
    with store.serving.locked():
        versions = store.versions()
        newest_valid = next((v for v in reversed(versions) if store.validate(v) is None), None)
        plan = read_plan(store.root)
        kept = set(versions[-keep_last:]) | store.serving.retained(keep_last) | {newest_valid}
        kept |= plan.versions() if plan is not None else set()  # a canary's or an A/B arm's
        keep = {v for version in kept if version is not None for v in _ancestry(store, version)}
        for version in versions:
            if version in keep:
                continue
            for path in (store.path(version), export_dir(store.root, version)):
                try:
                    if path.is_dir():
                        remove_tree(path)
                except OSError as exc:
                    raise SnapshotError(f"cannot delete {path}: {describe_os_error(exc)}") from exc
            deleted.append(version)
    if deleted:
        logger.info("pruned snapshots path=%s deleted=%s kept=%d", store.root,
                    ",".join(map(version_name, deleted)), len(versions) - len(deleted))
    return deleted


def end_traffic(store: Versions, plan: TrafficPlan, reason: str) -> None:
    """Record the end of ``plan`` and remove it (every user on CURRENT). Call it holding the lock.

    Raises:
        SnapshotError: the history or the plan cannot be written.
    """
    current = store.serving.current()
    served = current if current is not None else next(iter(sorted(plan.versions())))
    store.serving.record("end", served, served, reason, traffic=plan.describe())
    remove_plan(store.root)
    logger.info("ended traffic plan=%s reason=%s", plan.describe(), reason)


def _ancestry(store: Versions, version: int) -> Iterator[int]:
    """``version`` and the parents its chain names, as far as their manifests are readable."""
    seen: int | None = version
    while seen is not None:
        yield seen
        try:
            seen = store.manifest(seen).parent
        except SnapshotError:
            seen = None


def _current_or_none(pointer: ServingPointer) -> int | None:
    try:
        return pointer.current()
    except SnapshotError as exc:  # a broken pointer is what a promotion repairs
        logger.warning("replacing an unreadable serving pointer error=%s", exc)
        return None
