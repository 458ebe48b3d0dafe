r"""Promotion: how the version serving loads moves, and what retention keeps.

Serving loads the version ``<root>/serving/CURRENT`` names (`streamrec.snapshots.pointer`).
`promote` and `rollback` move that pointer only to a version whose every checksum (and its
export's) holds; `prune` deletes old versions but never the served one or the last ones served
before it. The history line is written before the pointer moves: a crash between the two
leaves a version recorded (and so kept) that was not served, never one served and unrecorded.
`SnapshotStore` offers all three as methods.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import NamedTuple, Protocol

from streamrec.errors import InvalidSnapshot, NotServable, SnapshotError
from streamrec.snapshots.directory import describe_os_error, remove_tree, version_name
from streamrec.snapshots.exports import ExportCheck, check_export, export_dir, refuse_unservable
from streamrec.snapshots.manifest import SnapshotManifest
from streamrec.snapshots.pointer import ServingPointer
from streamrec.snapshots.traffic import TrafficPlan, read_plan, remove_plan

logger = logging.getLogger(__name__)

# What `streamrec serve` makes of a version's export (serving's `check_loads`): missing, damaged,
# another learner's own, or whole and loaded. Without one, promotion checks the checksums alone.
ServeCheck = Callable[[int], ExportCheck]

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
    holds no model to export (the builder returns None), it is accepted. Given ``serve_check``
    (`streamrec serve`'s reading of the export, which verifies it as it reads), an export serve
    would not load is refused, a learner's own contract as `NotServable`; the command leaves the
    check out for a team's own server (``--own-server``).

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
        _require_export(store, version, build_export, serve_check)
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


def _require_export(
    store: Versions, version: int, build_export: BuildExport | None, serve_check: ServeCheck | None
) -> ExportCheck:
    """Raise unless ``version``'s export is whole and, given ``serve_check``, loaded by `streamrec serve`.

    A missing export is built first when a builder is given; one still missing (no builder, or
    nothing to export: a store without a model) is accepted and returned as such. Each file is
    hashed once (``serve_check`` verifies as it reads).

    Raises:
        InvalidSnapshot: the export is damaged (naming the file and the command that mends it).
        NotServable: ``serve_check`` says it is another learner's own, naming how to promote it
            for a server of the team's own.
    """
    check = serve_check or partial(check_export, store.root)
    export = check(version)
    if export.missing and build_export is not None and build_export(version) is not None:
        logger.info("built the missing export of version=%s before serving it", version_name(version))
        export = check(version)
    if export.own:
        raise NotServable(
            f"{export.problem}; a server of your own that scores it so and follows "
            f"{store.serving.current_path} takes it with `streamrec snapshot promote {version} --own-server`"
        )
    if not export.missing:
        refuse_unservable(export)
    return export


def _servable_problem(
    store: Versions, version: int, build_export: BuildExport | None, serve_check: ServeCheck | None
) -> str | None:
    """Why serving cannot take ``version`` (the snapshot or its export), or None."""
    problem = store.validate(version)
    if problem is not None:
        return problem
    try:
        _require_finite(store, version)
        _require_export(store, version, build_export, serve_check)
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


class Pruned(NamedTuple):
    """What `prune` deleted: whole versions, and the exports of versions kept for a chain alone."""

    versions: list[int]
    exports: list[int]


def prune(store: Versions, keep_last: int) -> Pruned:
    """Delete all but the newest ``keep_last`` versions, and exports no reader serves (0 keeps all).

    Never deleted: the current one, the ``keep_last`` versions a rollback steps back to and
    the ``keep_last`` served most recently (`ServingPointer.retained`: every version ever
    promoted would grow without bound where every snapshot is promoted), the newest valid one
    (what a learner resumes from), a traffic plan's, and every version the chain of a kept
    delta needs. A version kept for a chain alone loses its export: nothing serves it, and
    promoting it builds the export again (`promote`'s ``build_export``). Each deleted one is
    renamed to a ``.tmp-`` name before it is removed, so a crash leaves no half-deleted
    version, only a temporary removed at the next start. A long serving history is then
    compacted to the lines its readers need about the versions kept (`ServingPointer.compact`).

    Raises:
        SnapshotError: a negative ``keep_last``, an unreadable pointer, or a failed rename.
    """
    if keep_last < 0:
        raise SnapshotError(f"keep_last must be 0 (keep all) or more, not {keep_last}")
    if keep_last == 0:
        return Pruned([], [])
    deleted, exports = [], []
    with store.serving.locked():
        versions = store.versions()
        newest_valid = next((v for v in reversed(versions) if store.validate(v) is None), None)
        plan = read_plan(store.root)
        history = store.serving.lines()  # read once, under the lock: retention, then compaction
        kept = set(versions[-keep_last:]) | {newest_valid}
        kept |= store.serving.retained(keep_last, [event for _, event in history])
        kept |= plan.versions() if plan is not None else set()  # a canary's or an A/B arm's
        keep = {v for version in kept if version is not None for v in _ancestry(store, version)}
        for version in versions:
            # deleted, or kept for a chain only: no reader serves its export
            export_gone = version not in kept and _remove(export_dir(store.root, version))
            if version not in keep:
                _remove(store.path(version))
                deleted.append(version)
            elif export_gone:
                exports.append(version)
        # The history's lines about versions gone (and those no answer needs) go with them.
        try:
            store.serving.compact(set(store.versions()), history)
        except SnapshotError as exc:  # the versions are deleted; the history is whole, only long
            logger.warning("serving history not compacted error=%s", exc)
    if deleted:
        logger.info("pruned snapshots path=%s deleted=%s kept=%d", store.root,
                    ",".join(map(version_name, deleted)), len(versions) - len(deleted))
    return Pruned(deleted, exports)


def _remove(path: Path) -> bool:
    """Delete a version's directory or export, if there; whether it was.

    Raises:
        SnapshotError: it cannot be renamed or deleted.
    """
    try:
        if not path.is_dir():
            return False
        remove_tree(path)
        return True
    except OSError as exc:
        raise SnapshotError(f"cannot delete {path}: {describe_os_error(exc)}") from exc


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
