"""A snapshot version's manifest: what it holds besides its tensors, read and checked.

``manifest.json`` is pretty JSON sealed by ``manifest.sha256`` (``sha256sum`` format). It may
only name plain ``*.safetensors`` files of its own directory, and a delta (see
`streamrec.snapshots.delta`) only an earlier version as its parent.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import orjson

from streamrec.errors import InvalidSnapshot, LaterSnapshot
from streamrec.features import FeatureSchema
from streamrec.kafka.records import Position
from streamrec.snapshots.delta import DeltaSpec
from streamrec.snapshots.directory import describe_os_error, version_name

# A manifest may only name tensor files inside its own directory: no paths, no other formats.
_TENSOR_FILE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\.safetensors$")
MANIFEST = "manifest.json"
MANIFEST_SUM = "manifest.sha256"
# The learner type of a snapshot written before STREAMREC_MODEL__LEARNER existed: DIN was all.
DEFAULT_LEARNER = "din"
# The kinds of version this release reads: whole, or the rows changed since a parent.
KINDS = ("full", "delta")
# The learner state's layout this release writes and reads (``config.state_layout``; its
# history and migrations: `streamrec.learner.state`). A later release that changes the
# arrays' names or shapes records a higher one, which this release cannot read.
STATE_LAYOUT = 4


def layout_problem(layout: int) -> str | None:
    """Why this release cannot read a state of layout ``layout`` (a manifest's), or None when it can.

    Resume, export, `snapshot verify` and promotion say it in these words.
    """
    if 1 <= layout <= STATE_LAYOUT:
        return None
    later = "a later streamrec release wrote it: " if layout > STATE_LAYOUT else ""
    return (
        f"state layout {layout} is not one this version reads (1..{STATE_LAYOUT}): {later}resume, "
        "export or promote it with the streamrec version that wrote it, or start afresh in a new "
        "snapshot directory"
    )


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
    kind: str = "full"  # "full", or "delta": only what changed since ``parent``
    parent: int | None = None  # the version a delta applies to; None for a full snapshot
    delta: DeltaSpec = field(default_factory=dict)  # a delta's row counts and removed tensors
    # The newest event time trained on, epoch ms (freshness); None before the field existed.
    newest_event_ms: int | None = None
    # The samples topic's id (KIP-516) its positions are offsets in; None before the field
    # existed, or on brokers that keep no topic ids.
    samples_topic_id: str | None = None

    @property
    def name(self) -> str:
        """The version's name, ``v000007``."""
        return version_name(self.version)

    @property
    def learner(self) -> str:
        """The learner type that wrote it (``STREAMREC_MODEL__LEARNER``); ``din`` before the setting."""
        model = self.config.get("model")
        value = model.get("learner") if isinstance(model, dict) else None
        return value if isinstance(value, str) and value else DEFAULT_LEARNER

    @property
    def state_layout(self) -> int:
        """The learner state's layout (``config.state_layout``); 1 before it was recorded."""
        value = self.config.get("state_layout")
        return value if isinstance(value, int) else 1

    @property
    def schema(self) -> FeatureSchema:
        """The feature schema the model read (``config.features``); the default before schemas."""
        doc = self.config.get("features")
        return FeatureSchema.from_json(doc if isinstance(doc, list) else None)

    def to_json(self) -> bytes:
        """Pretty JSON, NaN metrics as null."""
        return orjson.dumps(asdict(self), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)

    @classmethod
    def from_json(cls, raw: bytes) -> SnapshotManifest:
        """Parse a manifest; fields this release does not know (a later one wrote it) are left out.

        So the code can be rolled back after an upgrade: each field added since was optional
        information (its reader takes None for a manifest without it), and what a version's
        tensors mean is checked apart (its kind, its model settings and state layout).
        """
        doc = orjson.loads(raw)
        doc["positions"] = tuple(Position(**o) for o in doc["positions"])
        return cls(**{name: value for name, value in doc.items() if name in _FIELDS})


_FIELDS = frozenset(f.name for f in fields(SnapshotManifest))


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


def _chain_link_ok(manifest: SnapshotManifest) -> bool:
    """A full snapshot has no parent; a delta's parent is an earlier version (so no cycles)."""
    if manifest.kind == "full":
        return manifest.parent is None and not manifest.delta
    parent = manifest.parent
    return (manifest.kind == "delta" and isinstance(parent, int) and not isinstance(parent, bool)
            and 0 < parent < manifest.version and isinstance(manifest.delta, dict))


def checksum_line(raw: bytes) -> bytes:
    """The content of ``manifest.sha256`` for a manifest of bytes ``raw``."""
    return f"{hashlib.sha256(raw).hexdigest()}  {MANIFEST}\n".encode()


def read_manifest(directory: Path, version: int) -> SnapshotManifest:
    """Read the manifest of ``directory``, the version ``version``, verifying its own checksum.

    Raises:
        InvalidSnapshot: the manifest or its checksum file is missing, changed or unreadable,
            or it names anything but tensor files of its own or a later version as parent.
        LaterSnapshot: it is of a kind a later release wrote (sealed, so not damage).
    """
    path = directory / MANIFEST
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
    if manifest.kind not in KINDS:
        raise LaterSnapshot(
            f"{path}: kind {manifest.kind!r} is not one this version reads ({', '.join(KINDS)}): a later "
            "streamrec release wrote it; read it with that release, or start afresh in a new snapshot "
            "directory"
        )
    if not _chain_link_ok(manifest):
        raise InvalidSnapshot(
            f"{path}: kind {manifest.kind!r} with parent {manifest.parent!r} is neither a full "
            "snapshot nor a delta on an earlier version"
        )
    for name in manifest.files:
        if not _TENSOR_FILE.match(name):
            raise InvalidSnapshot(f"{path} names {name!r}, which is not a .safetensors file of its own")
    return manifest
