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
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from streamrec.errors import InvalidSnapshot, SnapshotDirError, SnapshotError, SnapshotWriteError
from streamrec.faults import fault_point
from streamrec.kafka.records import Position
from streamrec.learner.lock import SnapshotLock
from streamrec.learner.snapshot_dir import (
    TMP_PREFIX,
    describe_os_error,
    ensure_directory,
    prepare_directory,
)
from streamrec.learner.snapshot_dir import free_bytes as disk_free_bytes

logger = logging.getLogger(__name__)

_DIR = re.compile(r"^v(\d{6,})$")
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


def version_name(version: int) -> str:
    """How a version is named on disk and on screen: ``v000007``."""
    return f"v{version:06d}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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

    def versions(self) -> list[int]:
        """Version directories, oldest first, whether valid or not."""
        if not self.root.is_dir():
            return []
        try:
            found = [_DIR.match(p.name) for p in self.root.iterdir() if p.is_dir()]
        except OSError as exc:
            cause = describe_os_error(exc)
            raise SnapshotDirError(f"cannot list snapshot directory {self.root}: {cause}") from exc
        return sorted(int(m.group(1)) for m in found if m)

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
            _fsync_dir(self.root)
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
            files[target.name] = _sha256(target)
        versions = self.versions()
        version = (versions[-1] if versions else 0) + 1
        created = datetime.now(UTC).isoformat(timespec="milliseconds")
        manifest = SnapshotManifest(version=version, created_at=created, files=files, **fields)
        raw = manifest.to_json()
        _write_file(tmp / MANIFEST, raw)
        _write_file(tmp / MANIFEST_SUM, f"{hashlib.sha256(raw).hexdigest()}  {MANIFEST}\n".encode())
        _fsync_dir(tmp)
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
        return manifest

    def validate(self, version: int) -> str | None:
        """Why a version is invalid (every checksum is verified), or None when it is valid."""
        return self._entry(version).problem

    def _verify(self, version: int, manifest: SnapshotManifest) -> None:
        for name, digest in manifest.files.items():
            path = self.path(version) / name
            try:
                matches = _sha256(path) == digest
            except FileNotFoundError as exc:
                raise InvalidSnapshot(f"{path} is missing") from exc
            except OSError as exc:
                raise InvalidSnapshot(f"cannot read {path}: {describe_os_error(exc)}") from exc
            if not matches:
                raise InvalidSnapshot(f"{path} does not match its checksum")

    def load(self, version: int) -> tuple[SnapshotManifest, Tensors]:
        """Read a version's manifest and tensors, verifying every checksum.

        Raises:
            InvalidSnapshot: the version failed a check.
        """
        manifest = self.manifest(version)
        self._verify(version, manifest)
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
