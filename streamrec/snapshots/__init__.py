"""Snapshots: versioned checkpoints on disk, and which version serving loads.

The learner writes versions here, serving reads them, the CLI inspects them; this package
imports neither the learner's internals nor serving.

- `SnapshotStore` is the snapshot directory: write, list, verify, load versions
  (`SnapshotManifest` each, `SnapshotEntry` with why one is invalid).
- `ServingPointer` is ``serving/CURRENT`` and its history (`ServingEvent`);
  `SnapshotStore.promote`, `rollback` and
  `prune` move it and keep what it needs.
- `SnapshotLock` lets one learner at a time write a directory.
- `diff_snapshots` compares two versions; `check_export` and
  `verify_export` check a version's export, which `streamrec.serving.export`
  builds; `streamrec.snapshots.materialize.materialize` writes a delta's chain as one
  full version.

Names are imported when first used.
"""

from __future__ import annotations

from streamrec.lazy import lazy_exports

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads either)
if TYPE_CHECKING:
    from streamrec.snapshots.diff import SnapshotDiff, TensorDiff, diff_snapshots
    from streamrec.snapshots.directory import version_name
    from streamrec.snapshots.exports import ExportCheck, check_export, verify_export
    from streamrec.snapshots.lock import SnapshotLock
    from streamrec.snapshots.manifest import SnapshotEntry, SnapshotManifest
    from streamrec.snapshots.pointer import ServingEvent, ServingPointer
    from streamrec.snapshots.store import SnapshotStore

__all__ = [
    "ExportCheck",
    "ServingEvent",
    "ServingPointer",
    "SnapshotDiff",
    "SnapshotEntry",
    "SnapshotLock",
    "SnapshotManifest",
    "SnapshotStore",
    "TensorDiff",
    "check_export",
    "diff_snapshots",
    "verify_export",
    "version_name",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "streamrec.snapshots.diff": ["SnapshotDiff", "TensorDiff", "diff_snapshots"],
        "streamrec.snapshots.directory": ["version_name"],
        "streamrec.snapshots.exports": ["ExportCheck", "check_export", "verify_export"],
        "streamrec.snapshots.lock": ["SnapshotLock"],
        "streamrec.snapshots.manifest": ["SnapshotEntry", "SnapshotManifest"],
        "streamrec.snapshots.pointer": ["ServingEvent", "ServingPointer"],
        "streamrec.snapshots.store": ["SnapshotStore"],
    },
)
