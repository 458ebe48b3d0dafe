"""Versioned, atomically written checkpoints: tensors in safetensors, a JSON manifest.

Layout of ``<root>/v000007/``: ``manifest.json`` (version, time, the Kafka positions trained up
to, metrics, config, file checksums), ``manifest.sha256`` (the manifest's own checksum, in
``sha256sum`` format) and one ``<name>.safetensors`` per tensor group (``model``,
``optimizer``, ``state``), written and read by `streamrec.snapshots.files`. Nothing is
pickled, so loading a snapshot runs no code. Files are world-readable, so a serving process
under another user can load them.

A snapshot is written into ``<root>/.tmp-*``, fsynced, then renamed into place: readers see a
whole snapshot or none. A version that fails any checksum (the manifest's included) is
invalid: readers skip it with a warning and a learner resumes from the newest valid one.
One learner at a time writes here (`streamrec.snapshots.lock`); ``streamrec snapshot
create`` asks it for a snapshot by dropping a request file in ``<root>/.requests/``
(`streamrec.snapshots.requests`).
Serving loads the version ``<root>/serving/CURRENT`` names (`streamrec.snapshots.pointer`):
promote, rollback and retention (`SnapshotStore.prune`) act on it (`streamrec.snapshots.promotion`).

With ``full_every`` K > 1 a version may be a delta (`streamrec.snapshots.delta`):
only the rows changed since its parent, the version before it, with a full snapshot every K
versions. A delta is valid only with its whole chain back to that full one; loading it applies
the chain in order, and retention keeps every version a kept one needs.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError

from streamrec.errors import (
    InvalidSnapshot,
    LaterSnapshot,
    SnapshotDirError,
    SnapshotError,
    SnapshotWriteError,
)
from streamrec.faults import fault_point
from streamrec.fileio import fsync_path
from streamrec.snapshots import promotion
from streamrec.snapshots.delta import apply_delta, delta_allowed, make_delta
from streamrec.snapshots.directory import (
    describe_os_error,
    ensure_directory,
    parse_version,
    prepare_directory,
    temporary,
    version_name,
)
from streamrec.snapshots.directory import free_bytes as disk_free_bytes
from streamrec.snapshots.files import (
    DIR_MODE,
    Tensors,
    finite_problem,
    read_tensor_files,
    verify_tensor_files,
    write_manifest_files,
    write_tensor_files,
)
from streamrec.snapshots.lock import SnapshotLock
from streamrec.snapshots.manifest import (
    MANIFEST,
    MANIFEST_SUM,
    SnapshotEntry,
    SnapshotManifest,
    layout_problem,
    read_manifest,
)
from streamrec.snapshots.pointer import ServingEvent, ServingPointer
from streamrec.snapshots.promotion import BuildExport, ServeCheck
from streamrec.snapshots.requests import SnapshotRequests

__all__ = ["MANIFEST", "MANIFEST_SUM", "SnapshotEntry", "SnapshotManifest", "SnapshotStore", "version_name"]

logger = logging.getLogger(__name__)

# Versions a message names one by one; past it, their count and range (a line, not a list).
_NAMED_VERSIONS = 5


@dataclass(frozen=True)
class _Parent:
    """The last version written or loaded, kept in memory as the parent of the next delta."""

    manifest: SnapshotManifest
    tensors: Tensors  # private copies
    depth: int  # deltas since the last full snapshot: 0 for a full one


class SnapshotStore:
    """The snapshot directory: write, list, load, and snapshot requests.

    Examples:
        >>> import shutil, tempfile
        >>> from streamrec.kafka import Position
        >>> store = SnapshotStore(Path(tempfile.mkdtemp()))
        >>> manifest = store.write(
        ...     {"model": {"w": np.ones(3, dtype=np.float32)}},
        ...     micro_batches=1, samples_trained=2, positions=(Position("samples", 0, 2),),
        ... )
        >>> manifest.version, store.versions()
        (1, [1])
        >>> sorted(path.name for path in store.path(1).iterdir())
        ['manifest.json', 'manifest.sha256', 'model.safetensors']
        >>> manifest, tensors = store.load(1)
        >>> manifest.positions, tensors["model"]["w"]
        ((Position(topic='samples', partition=0, offset=2),), array([1., 1., 1.], dtype=float32))
        >>> shutil.rmtree(store.root)
    """

    def __init__(
        self, root: Path, free_bytes: Callable[[Path], int] = disk_free_bytes, full_every: int = 1
    ) -> None:
        """Snapshots under ``root``; ``free_bytes(root)`` says how much space is left.

        ``full_every`` K: every K-th version written is full, the ones between deltas on the
        version before (1: all full). With K > 1 the store keeps a copy of the tensors last
        written or loaded, the parent of the next delta.
        """
        if full_every < 1:
            raise SnapshotError(f"full_every must be 1 (every snapshot full) or more, not {full_every}")
        self.root = Path(root)
        self._free_bytes = free_bytes
        self.serving = ServingPointer(self.root)
        self.requests = SnapshotRequests(self.root)  # `streamrec snapshot create` -> the learner
        self.full_every = full_every
        self._parent: _Parent | None = None

    def versions(self) -> list[int]:
        """Version directories, oldest first, whether valid or not."""
        if not self.root.is_dir():
            return []
        try:
            found = [parse_version(p.name) for p in self.root.iterdir() if p.is_dir()]
        except OSError as exc:
            cause = describe_os_error(exc)
            raise SnapshotDirError(f"cannot list snapshot directory {self.root}: {cause}") from exc
        return sorted(v for v in found if v is not None)

    def path(self, version: int) -> Path:
        """Directory of a version."""
        return self.root / version_name(version)

    # --- the directory, for the one learner that writes here -----------------------------

    def lock(self) -> SnapshotLock:
        """Create the directory if needed and take its lock, held until released.

        Raises:
            SnapshotInUse: another learner holds it.
            SnapshotDirError: the directory or its lock file cannot be created.
        """
        ensure_directory(self.root)
        return SnapshotLock(self.root).acquire()

    def prepare(self, snapshot_bytes: int, export_bytes: int = 0) -> None:
        """Check at start that snapshots of ``snapshot_bytes`` with exports of ``export_bytes`` fit here.

        Remove the leftovers of crashed writes. Call it holding `lock`.
        """
        prepare_directory(self.root, snapshot_bytes, self._free_bytes, export_bytes)

    # --- writing ----------------------------------------------------------------------

    def write(self, tensors: Tensors, **fields: Any) -> SnapshotManifest:
        """Write a new version atomically; ``fields`` fill the manifest (not version/files).

        The version is a delta when deltas are on, the store wrote or loaded the newest version
        on disk, and fewer than ``full_every - 1`` deltas follow the last full one.

        Raises:
            SnapshotWriteError: any file-system error, with no temporary directory left behind.
        """
        parent = self._delta_parent(tensors)
        written, depth = tensors, 0
        if parent is not None:
            written, spec = make_delta(parent.tensors, tensors)
            fields = fields | {"kind": "delta", "parent": parent.manifest.version, "delta": spec}
            depth = parent.depth + 1
        tmp = temporary(self.root)
        try:
            ensure_directory(self.root)
            tmp.mkdir()
            os.chmod(tmp, DIR_MODE)
            manifest = self._fill(tmp, written, fields)
            fault_point("snapshot.before_rename")
            os.rename(tmp, self.path(manifest.version))  # fails if the version exists: no overwrite
            fsync_path(self.root)
        except (OSError, SafetensorError) as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            cause = describe_os_error(exc)
            raise SnapshotWriteError(f"cannot write snapshot in {self.root}: {cause}") from exc
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._remember(manifest, tensors, depth)
        return manifest

    def _delta_parent(self, tensors: Tensors) -> _Parent | None:
        """The remembered parent if the next version is to be a delta on it, else None."""
        parent = self._parent
        if parent is None or parent.depth + 1 >= self.full_every or not delta_allowed(tensors):
            return None
        versions = self.versions()
        if not versions or versions[-1] != parent.manifest.version:
            return None  # a newer (or no) version on disk: start a new chain
        on_disk = self._manifest_or_none(parent.manifest.version)
        # Compared as written: a NaN metric is null on disk, and NaN equals nothing in memory.
        if on_disk is None or on_disk.to_json() != parent.manifest.to_json():
            return None  # another writer's version of that number
        return parent

    def _remember(self, manifest: SnapshotManifest, tensors: Tensors, depth: int) -> None:
        if self.full_every > 1:
            copies = {g: {k: np.array(v, copy=True) for k, v in a.items()} for g, a in tensors.items()}
            self._parent = _Parent(manifest, copies, depth)

    def _fill(self, tmp: Path, tensors: Tensors, fields: dict[str, Any]) -> SnapshotManifest:
        """Write tensors, manifest and its checksum into ``tmp``, each file sealed."""
        files = write_tensor_files(tmp, tensors)
        versions = self.versions()
        version = (versions[-1] if versions else 0) + 1
        created = datetime.now(UTC).isoformat(timespec="milliseconds")
        manifest = SnapshotManifest(version=version, created_at=created, files=files, **fields)
        write_manifest_files(tmp, manifest)
        fsync_path(tmp)
        return manifest

    # --- reading ----------------------------------------------------------------------

    def manifest(self, version: int) -> SnapshotManifest:
        """Read one manifest, verifying its own checksum.

        Raises:
            InvalidSnapshot: the manifest or its checksum file is missing, changed or unreadable.
        """
        return read_manifest(self.path(version), version)

    def validate(self, version: int) -> str | None:
        """Why a version is invalid, or None when it is valid.

        Why a version is invalid (every checksum of it and of its chain is verified), or None
        when it is valid.
        """
        return self._entry(version, {}).problem

    def verify(self, version: int) -> SnapshotManifest:
        """Verify every checksum of a version; return its manifest.

        Verify every checksum of a version and, for a delta, of its whole chain back to a
        full snapshot (tensors not loaded); return its manifest.

        Raises:
            InvalidSnapshot: no such version, or a file failed its checks (the message names it
                and, for a broken chain, the version it belongs to).
        """
        return self._check(version, {})

    def _check(self, version: int, known: dict[int, str | None]) -> SnapshotManifest:
        """`verify`; ``known`` holds the verdicts on versions already checked."""
        if not self.path(version).is_dir():
            raise InvalidSnapshot(f"no snapshot version {version_name(version)} in {self.root}")
        manifest = self.manifest(version)
        verify_tensor_files(self.path(version), manifest)
        parent = manifest.parent
        if parent is not None:
            if parent not in known:
                known[parent] = None
                try:
                    self._check(parent, known)
                except SnapshotError as exc:
                    known[parent] = str(exc)
            if known[parent] is not None:
                raise InvalidSnapshot(
                    f"{manifest.name} is a delta on {version_name(parent)}, which is not valid: "
                    f"{known[parent]}"
                )
        return manifest

    def chain(self, version: int) -> list[int]:
        """The versions loading ``version`` reads, its full snapshot first (manifests only read).

        Raises:
            InvalidSnapshot: a manifest of the chain is missing or failed its checks.
        """
        versions = [version]
        while (parent := self.manifest(versions[-1]).parent) is not None:
            versions.append(parent)
        return versions[::-1]

    def load(self, version: int) -> tuple[SnapshotManifest, Tensors]:
        """Read a version's manifest and tensors, verified.

        Read a version's manifest and tensors, verifying every checksum (of the whole chain
        for a delta) and applying a delta's chain in order.

        Raises:
            InvalidSnapshot: the version or its chain failed a check.
        """
        manifest = self.verify(version)
        chain = self.chain(version)
        tensors = self._tensors(chain)
        if version == (self.versions() or [0])[-1]:  # the newest: the parent of the next delta
            self._remember(manifest, tensors, len(chain) - 1)
        return manifest, tensors

    def state_problem(self, version: int) -> str | None:
        """Why a verified version's state is not loaded here, or None.

        A later release's state layout (`layout_problem`), or NaN or infinite values
        (`finite_problem`).

        Its tensors are read, the delta chain applied (checksums not verified again: call it
        after `verify`). Resume and export refuse such state; `snapshot verify` says so.

        Raises:
            InvalidSnapshot: a tensor file or a delta of the chain cannot be read.
        """
        problem = layout_problem(self.manifest(version).state_layout)  # a later release's: unread
        return problem or finite_problem(self._tensors(self.chain(version)))

    def _tensors(self, chain: list[int]) -> Tensors:
        """The tensors of the last version of ``chain`` (`chain`), its deltas applied in order."""
        links = [self.manifest(v) for v in chain]
        tensors = self._read(links[0])
        for link in links[1:]:
            tensors = apply_delta(tensors, self._read(link), link.delta, str(self.path(link.version)))
        return tensors

    def _read(self, manifest: SnapshotManifest) -> Tensors:
        return read_tensor_files(self.path(manifest.version), manifest)

    def latest_valid(self) -> tuple[SnapshotManifest, Tensors] | None:
        """The newest version that passes every check, loaded; None when there is none.

        Invalid versions are skipped with a warning naming the file and the reason.

        Raises:
            LaterSnapshot: a version newer than every valid one is of a form a later release wrote.
        """
        skipped = []
        for version in reversed(self.versions()):
            try:
                return self.load(version)
            except LaterSnapshot:
                raise  # not damage: resuming an older version would drop what it trained
            except SnapshotError as exc:
                logger.warning("skipping invalid snapshot version=%s reason=%s", version_name(version), exc)
                skipped.append(version_name(version))
        if skipped:
            logger.warning(
                "no valid snapshot path=%s invalid=%s", self.root, ",".join(skipped)
            )
        return None

    def entries(self) -> list[SnapshotEntry]:
        """Every version directory, oldest first, with why it is invalid if it is."""
        known: dict[int, str | None] = {}  # each version of a chain verified once
        return [self._entry(version, known) for version in self.versions()]

    def _entry(self, version: int, known: dict[int, str | None]) -> SnapshotEntry:
        try:
            manifest = self.manifest(version)
        except SnapshotError as exc:
            return SnapshotEntry(version, None, str(exc))
        try:
            self._check(version, known)
        except SnapshotError as exc:
            return SnapshotEntry(version, manifest, str(exc))
        return SnapshotEntry(version, manifest, None)

    def manifests(self) -> list[SnapshotManifest]:
        """Every readable manifest, oldest first (versions with a bad manifest left out)."""
        return [m for m in map(self._manifest_or_none, self.versions()) if m is not None]

    def latest(self) -> SnapshotManifest | None:
        """The newest readable manifest, or None (tensors not verified: see `latest_valid`)."""
        for version in reversed(self.versions()):
            manifest = self._manifest_or_none(version)
            if manifest is not None:
                return manifest
        return None

    def _manifest_or_none(self, version: int) -> SnapshotManifest | None:
        try:
            return self.manifest(version)
        except SnapshotError:
            return None

    def resolve(self, spec: str) -> int:
        """The version a name such as ``7``, ``current`` or ``latest`` names.

        A version named as ``v000007``, ``7``, ``current`` (the promoted one) or ``latest``
        (the newest valid one).

        Raises:
            SnapshotError: the name is malformed, or there is no such version (the message says
                which versions there are).
        """
        word = spec.strip().lower()
        if word == "current":
            version = self.current()
            if version is None:
                raise SnapshotError(f"no version is promoted in {self.root}: promote one first")
            return version
        if word == "latest":
            for version in reversed(self.versions()):
                if self.validate(version) is None:
                    return version
            raise SnapshotError(f"no valid snapshot in {self.root}")
        digits = word.removeprefix("v")
        if not digits.isdigit():
            raise SnapshotError(f"{spec!r} is not a version: give v000007, 7, current or latest")
        version = int(digits)
        if not self.path(version).is_dir():
            raise SnapshotError(f"no version {version_name(version)} in {self.root}: {self._holdings()}")
        return version

    def _holdings(self) -> str:
        """Which versions there are, for a message: a few by name, else how many and the range."""
        versions = [version_name(v) for v in self.versions()]
        if len(versions) <= _NAMED_VERSIONS:
            return f"it holds {', '.join(versions) or 'none'}"
        listed = "`streamrec snapshot list` names them"
        return f"it holds {len(versions)}, {versions[0]} to {versions[-1]}: {listed}"

    # --- serving: the promoted version, rollback, retention (streamrec.snapshots.promotion) ---

    def current(self) -> int | None:
        """The promoted version serving loads (``serving/CURRENT``), or None if none is.

        Raises:
            SnapshotError: CURRENT exists but is unreadable or names no version.
        """
        return self.serving.current()

    def promoted(self) -> list[int]:
        """Every version ever promoted, in order of first promotion (from the history)."""
        return self.serving.promoted()

    def history(self) -> list[ServingEvent]:
        """Every promotion and rollback, oldest first."""
        return self.serving.history()

    def promote(
        self,
        version: int,
        reason: str = "manual",
        build_export: BuildExport | None = None,
        serve_check: ServeCheck | None = None,
    ) -> SnapshotManifest:
        """Point serving at ``version``: `streamrec.snapshots.promotion.promote`."""
        return promotion.promote(self, version, reason, build_export, serve_check)

    def rollback(
        self,
        reason: str = "manual",
        build_export: BuildExport | None = None,
        serve_check: ServeCheck | None = None,
    ) -> int:
        """Point serving back a version: `streamrec.snapshots.promotion.rollback`."""
        return promotion.rollback(self, reason, build_export, serve_check)

    def prune(self, keep_last: int) -> list[int]:
        """Delete old versions, never the served one or those just before it; the versions deleted.

        `promotion.prune`, which also deletes the exports of versions kept for a chain alone
        (`pruned` says which).
        """
        return self.pruned(keep_last).versions

    def pruned(self, keep_last: int) -> promotion.Pruned:
        """`prune`, saying the versions and the exports it deleted: `promotion.prune`."""
        return promotion.prune(self, keep_last)

    # --- requests from `streamrec snapshot create`: filed in self.requests ---------------

    def find_request(self, request_id: str) -> SnapshotManifest | None:
        """The snapshot that answered a request, if any (newest first)."""
        for version in reversed(self.versions()):
            manifest = self._manifest_or_none(version)
            if manifest is not None and manifest.request_id == request_id:
                return manifest
        return None
