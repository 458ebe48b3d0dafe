"""Versioned, atomically written checkpoints: tensors in safetensors, a JSON manifest.

Layout of ``<root>/v000007/``: ``manifest.json`` (version, time, the Kafka positions trained up
to, metrics, config, file checksums) and one ``<name>.safetensors`` per tensor group (``model``,
``optimizer``, ``state``). Nothing is pickled, so loading a snapshot runs no code.

A snapshot is written into ``<root>/.tmp-*``, fsynced, then renamed into place: readers see a
whole snapshot or none. ``streamrec snapshot create`` asks a running learner for one by
dropping a request file in ``<root>/.requests/``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from streamrec.errors import SnapshotError
from streamrec.kafka.records import Position

_DIR = re.compile(r"^v(\d{6,})$")
MANIFEST = "manifest.json"


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


def _fsync_file(path: Path) -> None:
    with path.open("rb+") as fh:
        os.fsync(fh.fileno())


class SnapshotStore:
    """The snapshot directory: write, list, load, and snapshot requests."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def versions(self) -> list[int]:
        """Complete snapshot versions, oldest first."""
        if not self.root.is_dir():
            return []
        found = (_DIR.match(p.name) for p in self.root.iterdir() if p.is_dir())
        return sorted(int(m.group(1)) for m in found if m)

    def path(self, version: int) -> Path:
        """Directory of a version."""
        return self.root / version_name(version)

    def write(
        self, tensors: dict[str, dict[str, np.ndarray]], **fields: Any
    ) -> SnapshotManifest:
        """Write a new version atomically; ``fields`` fill the manifest (not version/files)."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".tmp-{uuid.uuid4().hex}"
        tmp.mkdir()
        try:
            files = {}
            for name, arrays in tensors.items():
                target = tmp / f"{name}.safetensors"
                save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(target))
                _fsync_file(target)
                files[target.name] = _sha256(target)
            versions = self.versions()
            version = (versions[-1] if versions else 0) + 1
            created = datetime.now(UTC).isoformat(timespec="milliseconds")
            manifest = SnapshotManifest(version=version, created_at=created, files=files, **fields)
            (tmp / MANIFEST).write_bytes(manifest.to_json())
            _fsync_file(tmp / MANIFEST)
            _fsync_dir(tmp)
            os.rename(tmp, self.path(version))  # fails if the version exists: no overwrite
            _fsync_dir(self.root)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise SnapshotError(f"cannot write snapshot in {self.root}: {exc}") from exc
        return manifest

    def manifest(self, version: int) -> SnapshotManifest:
        """Read one manifest."""
        path = self.path(version) / MANIFEST
        try:
            return SnapshotManifest.from_json(path.read_bytes())
        except (OSError, orjson.JSONDecodeError, TypeError, KeyError) as exc:
            raise SnapshotError(f"unreadable manifest {path}: {exc}") from exc

    def manifests(self) -> list[SnapshotManifest]:
        """Every manifest, oldest first."""
        return [self.manifest(v) for v in self.versions()]

    def latest(self) -> SnapshotManifest | None:
        """The newest manifest, or None."""
        versions = self.versions()
        return self.manifest(versions[-1]) if versions else None

    def load(self, version: int) -> tuple[SnapshotManifest, dict[str, dict[str, np.ndarray]]]:
        """Read a version's manifest and tensors, verifying checksums."""
        manifest = self.manifest(version)
        tensors = {}
        for name, digest in manifest.files.items():
            path = self.path(version) / name
            if not path.exists() or _sha256(path) != digest:
                raise SnapshotError(f"{path} is missing or does not match its checksum")
            try:
                tensors[name.removesuffix(".safetensors")] = load_file(str(path))
            except (OSError, SafetensorError) as exc:
                raise SnapshotError(f"cannot read {path}: {exc}") from exc
        return manifest, tensors

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
            manifest = self.manifest(version)
            if manifest.request_id == request_id:
                return manifest
        return None
