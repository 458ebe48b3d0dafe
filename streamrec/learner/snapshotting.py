"""A learner's state in and out of snapshots: restoring it, and what a snapshot of it holds.

The checks on either side of the snapshot store: a snapshot of another learner, another
feature schema or other model settings refuses to load in one line that names the setting;
state that is not finite is never written; state keys are grouped into one tensor file per
group, so serving reads the model apart from what only resumed training needs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from streamrec.config import MODEL_SETTINGS_INIT_ONLY, StreamrecConfig
from streamrec.errors import ConfigError, InvalidSnapshot, NonFiniteWeights, SnapshotError
from streamrec.features.schema import FeatureSchema
from streamrec.learner.base import Learner
from streamrec.learner.state import STATE_LAYOUT, migrate_state
from streamrec.snapshots.exports import export_bytes, onnx_missing
from streamrec.snapshots.files import finite_problem, named, non_finite
from streamrec.snapshots.store import SnapshotManifest, SnapshotStore, version_name

logger = logging.getLogger(__name__)


def restore(
    cfg: StreamrecConfig, schema: FeatureSchema, learner: Learner, snapshots: SnapshotStore
) -> SnapshotManifest | None:
    """Load the newest valid snapshot into ``learner``: its manifest, or None when there is none.

    Raises:
        ConfigError: the snapshot was written by another learner (``STREAMREC_MODEL__LEARNER``).
        SnapshotError: its state does not load into this model, naming the settings that differ.
    """
    found = snapshots.latest_valid()  # skips invalid versions, with a warning each
    if found is None:
        refuse_all_invalid(snapshots)
        logger.info("no snapshot to restore, starting fresh path=%s", snapshots.root)
        return None
    manifest, tensors = found
    if manifest.learner != cfg.model.learner:
        raise ConfigError(
            f"snapshot {manifest.name} in {snapshots.root} was written by "
            f"STREAMREC_MODEL__LEARNER={manifest.learner!r}, not {cfg.model.learner!r}: "
            "set it back to resume, or give STREAMREC_LEARNER__SNAPSHOT_DIR a new directory "
            "to start afresh"
        )
    where = f"snapshot {manifest.name} in {snapshots.root}"
    # A removed or redeclared feature refuses the snapshot in one line (SchemaChange).
    added = schema.check_evolution(manifest.schema, where)
    try:
        arrays = state_of(learner, manifest, tensors, added=bool(added))
    except SnapshotError as exc:
        raise SnapshotError(f"{where}: {exc}") from exc
    if added:
        logger.info(
            "features added since snapshot version=%d added=%s", manifest.version, ",".join(added)
        )
    try:
        learner.load_state_arrays(arrays)
    except SnapshotError as exc:
        raise SnapshotError(misfit(cfg, manifest, exc, snapshots.root)) from exc
    logger.info(
        "restored snapshot version=%d micro_batches=%d", manifest.version, manifest.micro_batches
    )
    changed = changed_settings(cfg, manifest)
    if changed:  # loaded, so its tensors fit: a change meant, or one that only fits by chance
        logger.warning("%s was trained with other model settings: %s", where, ", ".join(changed))
    return manifest


def refuse_all_invalid(snapshots: SnapshotStore) -> None:
    """Raise when the directory holds versions and none of them loads.

    A fresh model would start at the group's committed offset, the last snapshot's: what every
    version trained would be dropped with a warning an operator may never read.

    Raises:
        InvalidSnapshot: naming the newest version, why it does not load, and what to do.
    """
    versions = snapshots.versions()
    if not versions:
        return
    newest = snapshots.validate(versions[-1]) or "it did not load"
    others = f" and the {len(versions) - 1} older" if len(versions) > 1 else ""
    raise InvalidSnapshot(
        f"no snapshot in {snapshots.root} loads: {version_name(versions[-1])}{others} failed their "
        f"checks ({newest}); a learner started on it would begin a new model, dropping what they "
        "trained. Restore the directory from a backup, or move it aside (or give "
        "STREAMREC_LEARNER__SNAPSHOT_DIR a new directory) to start a new model"
    )


def state_of(
    learner: Learner,
    manifest: SnapshotManifest,
    tensors: Mapping[str, Mapping[str, np.ndarray]],
    added: bool,
) -> dict[str, np.ndarray]:
    """A snapshot's state (its ``tensors`` by group) as arrays that load into ``learner``.

    The one way a snapshot's state is read (by `restore` and by the export): brought from
    the manifest's state layout to today's (`migrate_state`), then, for a learner with
    ``adopt_state`` (a table learner's, `streamrec.learner.state_arrays.StateArrays.adopt_state`),
    given what the features ``added`` since and the layouts after it gave the model.

    State that is not finite is refused, as it is never written: a file edited by hand or by
    another tool, resealed, would otherwise resume a learner or be exported and promoted, and
    serving would answer NaN scores.

    Raises:
        InvalidSnapshot: a floating-point array holds NaN or infinite values (naming them).
        SnapshotError: the state's layout is newer than this version reads.
    """
    problem = finite_problem(tensors)
    if problem is not None:
        raise InvalidSnapshot(problem)
    arrays = {f"{group}/{key}": v for group, arrays in tensors.items() for key, v in arrays.items()}
    layout = manifest.state_layout
    arrays = migrate_state(arrays, layout)
    adopt = getattr(learner, "adopt_state", None)
    if not callable(adopt) or not (added or layout < STATE_LAYOUT):
        return arrays
    fitted: dict[str, np.ndarray] = adopt(arrays, manifest.schema, layout)
    return fitted


def misfit(cfg: StreamrecConfig, manifest: SnapshotManifest, exc: SnapshotError, root: Path) -> str:
    """Why a snapshot's state does not load into this model.

    Why ``manifest``'s state does not load into this model, naming the model settings
    it was written with where they differ from these (an upgrade that added one, say).
    """
    differ = changed_settings(cfg, manifest)
    where = f"snapshot {manifest.name} in {root}"
    if not differ:
        return f"{where} does not load into this model: {exc}"
    return (
        f"{where} was written by a model with other settings: {', '.join(differ)}; set "
        "those to resume it, or give STREAMREC_LEARNER__SNAPSHOT_DIR a new directory to "
        f"start afresh ({exc})"
    )


def changed_settings(cfg: StreamrecConfig, manifest: SnapshotManifest) -> list[str]:
    """The model settings ``manifest``'s state was trained with that differ from ``cfg``'s.

    As ``STREAMREC_MODEL__<NAME>=<then> (now <now>)``; those that only start a model (the seed,
    the device) are left out.
    """
    saved = cfg.model.as_written(manifest.config.get("model", {}))
    now = cfg.model.model_dump(mode="json")
    return [
        f"STREAMREC_MODEL__{key.upper()}={json.dumps(saved[key])} (now {json.dumps(value)})"
        for key, value in now.items()
        if key in saved and saved[key] != value and key not in MODEL_SETTINGS_INIT_ONLY
    ]


def snapshot_config(cfg: StreamrecConfig, schema: FeatureSchema) -> dict[str, Any]:
    """The settings a snapshot's manifest keeps: what its state was trained with."""
    return {
        "model": cfg.model.model_dump(mode="json"),
        "features": schema.to_json(),
        "state_layout": STATE_LAYOUT,
        "learner": cfg.learner.model_dump(mode="json"),
        "kafka": {"samples_topic": cfg.kafka.samples_topic},
    }


def require_finite(arrays: Mapping[str, np.ndarray], micro_batches: int) -> None:
    """Refuse state whose floating-point arrays are not all finite: serving would load it.

    Raises:
        NonFiniteWeights: naming the arrays (weights or optimizer moments) that are not.
    """
    bad = non_finite(arrays)
    if bad:
        raise NonFiniteWeights(
            f"not snapshotting micro-batch {micro_batches}: {len(bad)} state arrays hold NaN or "
            f"infinite values ({named(bad)}); restart from the last snapshot"
        )


# The ONNX graph's bytes over the parameters': the default DIN's model.onnx was 18.6 MB beside
# 13.8 MB of parameters (its ONNX forms hold some weights in other shapes), rounded up.
_ONNX_BYTES_PER_PARAMETER_BYTE = 1.4


def export_estimate(root: Path, arrays: Mapping[str, np.ndarray]) -> int:
    """Bytes an export of this model takes.

    The newest export's size, or before any, the model group's (the export holds the model's
    parameters and id tables, no optimizer state), and its ONNX graph's where the ``onnx`` extra
    is installed (the parameters again, in the graph).
    """
    newest = export_bytes(root)
    if newest:
        return newest
    parameters = sum(a.nbytes for k, a in arrays.items() if k.startswith("model/"))
    return parameters + (0 if onnx_missing() else int(parameters * _ONNX_BYTES_PER_PARAMETER_BYTE))


def group_state(arrays: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """Split ``<group>/<name>`` state keys into one tensor file per group.

    What serving needs (``model``) apart from what only resumed training needs (``optimizer``,
    ``state``).
    """
    groups: dict[str, dict[str, np.ndarray]] = {}
    for key, array in arrays.items():
        group, _, name = key.partition("/")
        groups.setdefault(group, {})[name] = array
    return groups
