"""Versioned, atomically written checkpoints: tensors in safetensors, a JSON manifest.

Layout of ``<root>/v000007/``: ``manifest.json`` (version, time, the Kafka positions trained up
to, metrics, config, file checksums), ``manifest.sha256`` (the manifest's own checksum, in
``sha256sum`` format) and one ``<name>.safetensors`` per tensor group (``model``,
``optimizer``, ``state``). Nothing is pickled, so loading a snapshot runs no code. Files are
world-readable, so a serving process under another user can load them.

A snapshot is written into ``<root>/.tmp-*``, fsynced, then renamed into place: readers see a
whole snapshot or none. A version that fails any checksum (the manifest's included) is
invalid: readers skip it with a warning and a learner resumes from the newest valid one.
One learner at a time writes here (:mod:`streamrec.learner.lock`); ``streamrec snapshot
create`` asks it for a snapshot by dropping a request file in ``<root>/.requests/``.
Serving loads the version ``<root>/serving/CURRENT`` names (:mod:`streamrec.learner.promotion`):
promote, rollback and retention (:meth:`SnapshotStore.prune`) act on it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from safetensors import SafetensorError, safe_open
from safetensors.numpy import load_file, save_file

from streamrec.errors import InvalidSnapshot, SnapshotDirError, SnapshotError, SnapshotWriteError
from streamrec.faults import fault_point
from streamrec.fileio import fsync_path, sha256_file
from streamrec.kafka.records import Position
from streamrec.learner.lock import SnapshotLock
from streamrec.learner.promotion import ServingEvent, ServingPointer
from streamrec.learner.snapshot_dir import (
    TMP_PREFIX,
    describe_os_error,
    ensure_directory,
    parse_version,
    prepare_directory,
    remove_tree,
    version_name,
)
from streamrec.learner.snapshot_dir import free_bytes as disk_free_bytes

logger = logging.getLogger(__name__)

# A manifest may only name tensor files inside its own directory: no paths, no other formats.
_TENSOR_FILE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\.safetensors$")
MANIFEST = "manifest.json"
MANIFEST_SUM = "manifest.sha256"
_FILE_MODE = 0o644  # world-readable: serving may run as another user (safetensors writes 0600)
_DIR_MODE = 0o755

Tensors = dict[str, dict[str, np.ndarray]]


@dataclass(frozen=True)
class SnapshotManifest:
    """What a snapshot holds besides its tensors."""

    version: int
    created_at: str
    micro_batches: int
    samples_trained: int
    positions: tuple[Position, ...]  # the next offset to read, per partition
    metrics: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # file name -> sha256
    request_id: str | None = None

    @property
    def name(self) -> str:
        """The version's name, ``v000007``."""
        return version_name(self.version)

    def to_json(self) -> bytes:
        """Pretty JSON, NaN metrics as null."""
        return orjson.dumps(asdict(self), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)

    @classmethod
    def from_json(cls, raw: bytes) -> SnapshotManifest:
        """Parse a manifest."""
        doc = orjson.loads(raw)
        doc["positions"] = tuple(Position(**o) for o in doc["positions"])
        return cls(**doc)


@dataclass(frozen=True)
class SnapshotEntry:
    """One version directory as ``snapshot list`` shows it, valid or not."""

    version: int
    manifest: SnapshotManifest | None  # None when the manifest itself failed its checks
    problem: str | None  # why the version is invalid; None when every checksum matched

    @property
    def name(self) -> str:
        """The version's name, ``v000007``."""
        return version_name(self.version)


def _write_file(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    _seal(path)


def _seal(path: Path) -> None:
    """Make a written file world-readable and durable."""
    os.chmod(path, _FILE_MODE)
    with path.open("rb+") as fh:
        os.fsync(fh.fileno())


class SnapshotStore:
    """The snapshot directory: write, list, load, and snapshot requests."""

    def __init__(self, root: Path, free_bytes: Callable[[Path], int] = disk_free_bytes) -> None:
        """Snapshots under ``root``; ``free_bytes(root)`` says how much space is left."""
        self.root = Path(root)
        self._free_bytes = free_bytes
        self.serving = ServingPointer(self.root)

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

    def prepare(self, snapshot_bytes: int) -> None:
        """Check at start that snapshots of ``snapshot_bytes`` fit here; remove the leftovers
        of crashed writes. Call it holding :meth:`lock`."""
        prepare_directory(self.root, snapshot_bytes, self._free_bytes)

    # --- writing ----------------------------------------------------------------------

    def write(self, tensors: Tensors, **fields: Any) -> SnapshotManifest:
        """Write a new version atomically; ``fields`` fill the manifest (not version/files).

        Raises:
            SnapshotWriteError: any file-system error, with no temporary directory left behind.
        """
        tmp = self.root / f"{TMP_PREFIX}{uuid.uuid4().hex}"
        try:
            ensure_directory(self.root)
            tmp.mkdir()
            os.chmod(tmp, _DIR_MODE)
            manifest = self._fill(tmp, tensors, fields)
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
        return manifest

    def _fill(self, tmp: Path, tensors: Tensors, fields: dict[str, Any]) -> SnapshotManifest:
        """Write tensors, manifest and its checksum into ``tmp``, each file sealed."""
        files = {}
        for name, arrays in tensors.items():
            target = tmp / f"{name}.safetensors"
            save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(target))
            _seal(target)
            files[target.name] = sha256_file(target)
        versions = self.versions()
        version = (versions[-1] if versions else 0) + 1
        created = datetime.now(UTC).isoformat(timespec="milliseconds")
        manifest = SnapshotManifest(version=version, created_at=created, files=files, **fields)
        raw = manifest.to_json()
        _write_file(tmp / MANIFEST, raw)
        _write_file(tmp / MANIFEST_SUM, f"{hashlib.sha256(raw).hexdigest()}  {MANIFEST}\n".encode())
        fsync_path(tmp)
        return manifest

    # --- reading ----------------------------------------------------------------------

    def manifest(self, version: int) -> SnapshotManifest:
        """Read one manifest, verifying its own checksum.

        Raises:
            InvalidSnapshot: the manifest or its checksum file is missing, changed or unreadable.
        """
        path = self.path(version) / MANIFEST
        try:
            raw = path.read_bytes()
            recorded = (path.parent / MANIFEST_SUM).read_text().split()[:1]
        except FileNotFoundError as exc:
            raise InvalidSnapshot(f"{exc.filename} is missing") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidSnapshot(f"cannot read {path}: {describe_os_error(exc)}") from exc
        if recorded != [hashlib.sha256(raw).hexdigest()]:
            raise InvalidSnapshot(f"{path} does not match its checksum in {MANIFEST_SUM}")
        try:
            manifest = SnapshotManifest.from_json(raw)
        except (orjson.JSONDecodeError, TypeError, KeyError) as exc:
            raise InvalidSnapshot(f"unreadable manifest {path}: {exc}") from exc
        if manifest.version != version:
            raise InvalidSnapshot(f"{path} is of version {manifest.version}, not {version}")
        for name in manifest.files:
            if not _TENSOR_FILE.match(name):
                raise InvalidSnapshot(f"{path} names {name!r}, which is not a .safetensors file of its own")
        return manifest

    def validate(self, version: int) -> str | None:
        """Why a version is invalid (every checksum is verified), or None when it is valid."""
        return self._entry(version).problem

    def _verify(self, version: int, manifest: SnapshotManifest) -> None:
        for name, digest in manifest.files.items():
            path = self.path(version) / name
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

    def verify(self, version: int) -> SnapshotManifest:
        """Verify every checksum of a version (tensors not loaded) and return its manifest.

        Raises:
            InvalidSnapshot: no such version, or a file failed its checks (the message names it).
        """
        if not self.path(version).is_dir():
            raise InvalidSnapshot(f"no snapshot version {version_name(version)} in {self.root}")
        manifest = self.manifest(version)
        self._verify(version, manifest)
        return manifest

    def load(self, version: int) -> tuple[SnapshotManifest, Tensors]:
        """Read a version's manifest and tensors, verifying every checksum.

        Raises:
            InvalidSnapshot: the version failed a check.
        """
        manifest = self.verify(version)
        tensors = {}
        for name in manifest.files:
            path = self.path(version) / name
            try:
                tensors[name.removesuffix(".safetensors")] = load_file(str(path))
            except (OSError, SafetensorError) as exc:
                raise InvalidSnapshot(f"cannot read {path}: {describe_os_error(exc)}") from exc
        return manifest, tensors

    def latest_valid(self) -> tuple[SnapshotManifest, Tensors] | None:
        """The newest version that passes every check, loaded; None when there is none.

        Invalid versions are skipped with a warning naming the file and the reason.
        """
        skipped = []
        for version in reversed(self.versions()):
            try:
                return self.load(version)
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
        return [self._entry(version) for version in self.versions()]

    def _entry(self, version: int) -> SnapshotEntry:
        try:
            manifest = self.manifest(version)
        except SnapshotError as exc:
            return SnapshotEntry(version, None, str(exc))
        try:
            self._verify(version, manifest)
        except SnapshotError as exc:
            return SnapshotEntry(version, manifest, str(exc))
        return SnapshotEntry(version, manifest, None)

    def manifests(self) -> list[SnapshotManifest]:
        """Every readable manifest, oldest first (versions with a bad manifest left out)."""
        return [m for m in map(self._manifest_or_none, self.versions()) if m is not None]

    def latest(self) -> SnapshotManifest | None:
        """The newest readable manifest, or None (tensors not verified: see :meth:`latest_valid`)."""
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
        """A version named as ``v000007``, ``7``, ``current`` (the promoted one) or ``latest``
        (the newest valid one).

        Raises:
            SnapshotError: the name is malformed, or there is no such version.
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
        return int(digits)

    # --- serving: the promoted version, rollback, retention ------------------------------

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

    def promote(self, version: int, reason: str = "manual") -> SnapshotManifest:
        """Verify every checksum of ``version``, then point serving at it.

        Raises:
            InvalidSnapshot: the version is missing or failed a check (the message names the file);
                the pointer is unchanged.
            SnapshotError: the pointer or its history cannot be written.
        """
        with self.serving.locked():
            manifest = self.verify(version)
            previous = self._current_or_none()
            self.serving.record("promote", version, previous, reason)
            self.serving.point(version)
        logger.info("promoted snapshot version=%s previous=%s reason=%s", manifest.name,
                    previous and version_name(previous), reason)
        return manifest

    def rollback(self, reason: str = "manual") -> int:
        """Point serving back at the version promoted before the current one, skipping any that
        is no longer valid; returns it.

        Raises:
            SnapshotError: nothing is promoted, or no earlier promoted version is valid.
        """
        with self.serving.locked():
            current = self.current()
            if current is None:
                raise SnapshotError(f"no version is promoted in {self.root}: nothing to roll back")
            skipped = []
            for version in self.serving.rollback_candidates(current):
                problem = self.validate(version)
                if problem is None:
                    self.serving.record("rollback", version, current, reason)
                    self.serving.point(version)
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

    def prune(self, keep_last: int) -> list[int]:
        """Delete all but the newest ``keep_last`` versions (0 keeps all); returns those deleted.

        Never deleted: a version ever promoted, the current one, and the newest valid one (what
        a learner resumes from). Each is renamed to a ``.tmp-`` name before it is removed, so a
        crash leaves no half-deleted version, only a temporary removed at the next start.

        Raises:
            SnapshotError: a negative ``keep_last``, an unreadable pointer, or a failed rename.
        """
        if keep_last < 0:
            raise SnapshotError(f"keep_last must be 0 (keep all) or more, not {keep_last}")
        if keep_last == 0:
            return []
        deleted = []
        with self.serving.locked():
            versions = self.versions()
            newest_valid = next((v for v in reversed(versions) if self.validate(v) is None), None)
            keep = set(versions[-keep_last:]) | set(self.promoted()) | {newest_valid}
            for version in versions:
                if version in keep:
                    continue
                try:
                    remove_tree(self.path(version))
                except OSError as exc:
                    cause = describe_os_error(exc)
                    raise SnapshotError(f"cannot delete snapshot {self.path(version)}: {cause}") from exc
                deleted.append(version)
        if deleted:
            logger.info("pruned snapshots path=%s deleted=%s kept=%d", self.root,
                        ",".join(map(version_name, deleted)), len(versions) - len(deleted))
        return deleted

    def _current_or_none(self) -> int | None:
        try:
            return self.current()
        except SnapshotError as exc:  # a broken pointer is what a promotion repairs
            logger.warning("replacing an unreadable serving pointer error=%s", exc)
            return None

    # --- requests from `streamrec snapshot create` -------------------------------------

    @property
    def _requests(self) -> Path:
        return self.root / ".requests"

    def request(self) -> str:
        """File a request for a snapshot; returns its id."""
        request_id = uuid.uuid4().hex
        self._requests.mkdir(parents=True, exist_ok=True)
        tmp = self._requests / f".{request_id}.tmp"
        tmp.write_bytes(b"")
        os.rename(tmp, self._requests / request_id)
        return request_id

    def pending_requests(self) -> list[str]:
        """Ids of requests no snapshot has answered yet."""
        if not self._requests.is_dir():
            return []
        return sorted(p.name for p in self._requests.iterdir() if not p.name.startswith("."))

    def done(self, request_id: str) -> None:
        """Remove an answered request."""
        (self._requests / request_id).unlink(missing_ok=True)

    def find_request(self, request_id: str) -> SnapshotManifest | None:
        """The snapshot that answered a request, if any (newest first)."""
        for version in reversed(self.versions()):
            manifest = self._manifest_or_none(version)
            if manifest is not None and manifest.request_id == request_id:
                return manifest
        return None
