"""Export a snapshot as a Paddle Inference model plus what turns raw ids into its inputs.

``<snapshots>/exports/v000007/`` holds:

- ``model.json`` and ``model.pdiparams``: the `ScoringGraph`,
  saved by ``paddle.jit.save``; ``paddle.inference.create_predictor`` loads it without any
  streamrec code. The id statistics are constants inside it.
- ``ids/<table>.keys.npy`` per dynamic table (uint64, sorted: the xxh3_64 fingerprints of
  the ids with a row of their own) and ``ids/<table>.rows.npy`` (int64, their rows): plain
  ``.npy`` arrays, which ``numpy.load(allow_pickle=False)`` reads without running code.
- ``model.onnx``, where the ``onnx`` extra is installed: the same graph as ONNX, for ONNX
  Runtime (`streamrec.serving.onnxfile`; the contract's ``onnx`` entry names it).
- ``contract.json``: the scoring contract (`streamrec.serving.contract`: inputs, their
  order, shapes, dtypes, padding, how an id becomes a row, the output, every feature the
  model reads), the model version and the training configuration.
- ``manifest.json`` with every file's sha256, and ``manifest.sha256``.

That is the export of DIN and of DeepFM (one scoring graph: both models take the same
inputs). Each input in the contract states its ``source`` (the target's rows, the sequence's,
the context ids', the user's statistics bucket, a declared feature's value for the target or
along the sequence), from which serving builds it.

The export is the learner's own: each learner type has its exporter (`EXPORTERS`, looked
up by the snapshot's learner type), or its class exports itself with
an ``export_for_serving(directory, version)`` method that writes its files and its scoring
contract (``contract.json``); the checksums and the atomic rename are the same for all. A
learner with neither trains and snapshots, but is refused here in one line.

An export is written into a temporary directory and renamed into place, so serving sees a
whole export or none; files are world-readable. Nothing in it is pickled.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import paddle

from streamrec.config import BEHAVIOUR_FEATURES, ModelConfig
from streamrec.errors import InvalidSnapshot, NotExportable, SnapshotError, SnapshotWriteError
from streamrec.faults import fault_point
from streamrec.fileio import fsync_path, sha256_file
from streamrec.learner.base import Learner
from streamrec.learner.features import FeaturePlan
from streamrec.learner.onnxforms import onnx_form_layers, onnx_forms
from streamrec.learner.registry import make_learner
from streamrec.learner.snapshotting import state_of
from streamrec.learner.trainer import TableLearner
from streamrec.serving.contract import CONTRACT, IDS_DIR, contract, feature_inputs, ids_files
from streamrec.serving.graph import (
    ContextScoringGraph,
    FeatureContextScoringGraph,
    FeatureScoringGraph,
    ScoringGraph,
)
from streamrec.serving.loading import read_checked
from streamrec.serving.onnxfile import onnx_missing, write_onnx
from streamrec.serving.probe import graphs_problem
from streamrec.serving.traced import TracedGraphs
from streamrec.snapshots.directory import (
    parse_version,
    remove_temporaries,
    remove_tree,
    temporary,
    version_name,
)
from streamrec.snapshots.exports import (
    EXPORTS,
    MANIFEST,
    MANIFEST_SUM,
    export_dir,
)
from streamrec.snapshots.exports import verify_export as verify_export  # its old home
from streamrec.snapshots.lock import exclusive
from streamrec.snapshots.manifest import DEFAULT_LEARNER
from streamrec.snapshots.store import SnapshotStore

MODEL_PREFIX = "model"
logger = logging.getLogger(__name__)
_TRACED = TracedGraphs()  # this process's exports' scoring graphs

# Paddle's own ones_like reads a tensor's place, which a traced (PIR) tensor does not have: it
# warned three times a trace, two traces an export, in every learner's log. Nothing of ours.
warnings.filterwarnings("ignore", message="Tensor do not have 'place' interface", category=UserWarning)

_FILE_MODE = 0o644
_DIR_MODE = 0o755


# Writes a learner's serving files (its model and contract.json) into an export's directory.
Exporter = Callable[[Path, int], None]


def learner_from_snapshot(store: SnapshotStore, version: int) -> tuple[str, Learner]:
    """The learner type of a snapshot version and a learner of that type holding its state.

    The learner holds ``version``'s state (its checksums verified), on the device this
    process already uses (Paddle's device is process-global: a learner exporting beside its
    training must not move it).

    Raises:
        InvalidSnapshot: the version failed a check or holds no model configuration.
        ConfigError: the learner type it names does not load here.
    """
    manifest, tensors = store.load(version)
    model_doc = manifest.config.get("model")
    if not isinstance(model_doc, dict):
        raise InvalidSnapshot(f"{store.path(version)}: the manifest holds no model configuration")
    cfg = ModelConfig.recorded(model_doc, device=paddle.device.get_device())
    if unknown := ModelConfig.unknown(model_doc):  # a later release's: the model is built without them
        logger.warning(
            "%s records model settings this release does not know, built without them: %s (if they change "
            "the model, export it with the release that wrote it)", store.path(version), ", ".join(unknown),
        )
    learner = make_learner(cfg, manifest.schema)  # the features the model was trained to read
    try:
        arrays = state_of(learner, manifest, tensors, added=False)
    except SnapshotError as exc:
        raise InvalidSnapshot(f"{store.path(version)}: {exc}") from exc
    learner.load_state_arrays(arrays)
    return manifest.learner, learner


def exporter(learner: Learner, learner_type: str = DEFAULT_LEARNER) -> Exporter:
    """How ``learner`` (of type ``learner_type``) writes its export.

    Raises:
        NotExportable: the learner has no exporter and exports no way of its own.
    """
    own = getattr(learner, "export_for_serving", None)
    if callable(own):
        return own  # the learner's own method, found by name
    builtin = EXPORTERS.get(learner_type)
    if builtin is not None:
        return partial(builtin, learner)
    raise NotExportable(
        f"learner {learner_type} cannot be exported for serving: it has no registered exporter "
        "and its class no export_for_serving(directory, version) method (training and snapshots "
        "work without one)"
    )


def export_snapshot(store: SnapshotStore, version: int, rebuild: bool = False, strict: bool = False) -> Path:
    """Export ``version`` (once: an existing export is kept) and return its directory.

    With ``rebuild`` an existing export that fails its checksums, or that `streamrec serve`
    would not load (`streamrec.serving.loading.check_loads`: resealed after an edit, say), is
    deleted and written again from the snapshot; a whole one is kept. Rebuilds take turns (`_rebuilding`), so
    two at once never delete what the other wrote: the second finds the export whole.

    With ``strict`` a version that fails its checks is refused though its export is whole
    and kept (`snapshot export`: nothing `verify` refuses is handed over). An export built
    checks its version as it loads it (`learner_from_snapshot`), either way: once.

    Raises:
        InvalidSnapshot: the version failed a check.
        ConfigError: the version's learner type does not load here.
        NotExportable: its learner type has no exporter (nothing is left behind).
        SnapshotWriteError: the export could not be written (nothing is left behind).
        SnapshotError: another rebuild held its turn past `REBUILD_WAIT_S` (named).
    """
    target = export_dir(store.root, version)
    if target.is_dir():
        if not rebuild or _fault(store, version) is None:
            if strict:  # its checksums, then its state (a later layout, NaN), as resume checks
                problem = store.validate(version) or store.state_problem(version)
                if problem is not None:
                    raise InvalidSnapshot(problem)
            return target
        with _rebuilding(target.parent, version):  # one at a time: none deletes what another wrote
            return _rebuild(store, version, target)
    kind, learner = learner_from_snapshot(store, version)
    return _write(exporter(learner, kind), kind, target, version)


def _rebuild(store: SnapshotStore, version: int, target: Path) -> Path:
    """Delete a damaged export and write it again; call it holding `_rebuilding`.

    An export found whole now was rebuilt by another while this one waited: kept.
    """
    problem = _fault(store, version)
    if problem is None:
        logger.warning("export version=%s was rebuilt by another export meanwhile: kept", version)
        return target
    kind, learner = learner_from_snapshot(store, version)  # the snapshot is valid before deleting
    write = exporter(learner, kind)
    if target.is_dir():
        fault_point("export.before_delete")
        try:
            remove_tree(target)
        except OSError as exc:
            raise SnapshotWriteError(f"cannot delete the damaged export {target}: {exc}") from exc
        logger.warning("rebuilding damaged export version=%s problem=%s", version, problem)
    return _write(write, kind, target, version)


def _fault(store: SnapshotStore, version: int) -> str | None:
    """Why ``version``'s export is rebuilt (missing, damaged, not loading or scoring), or None.

    None: it is kept (a learner's own, whole, too).
    """
    check, contents = read_checked(store.root, version)
    if check.own:
        return None
    if contents is None:
        return check.problem or "missing"
    return graphs_problem(contents)


# How long a rebuild waits for another export's rebuild: exports of the largest models take
# minutes; one held longer is stuck (its process stopped), not slow.
REBUILD_WAIT_S = 600.0
_REBUILD_LOCK = ".rebuild.lock"  # in exports/: not a version's name, so retention leaves it


@contextmanager
def _rebuilding(folder: Path, version: int) -> Iterator[None]:
    """Hold the exports' rebuild lock, noting the version; wait for (and say so) another rebuild.

    Raises:
        SnapshotError: another rebuild held it past `REBUILD_WAIT_S`, naming its version.
    """
    lock = folder / _REBUILD_LOCK

    def holder(fd: int) -> str:
        try:
            note = orjson.loads(os.pread(fd, 256, 0))
            return f"of {version_name(int(note['version']))} (pid {int(note['pid'])})"
        except (OSError, ValueError, TypeError, KeyError):
            return "(it has not named itself yet)"

    def waiting(fd: int) -> None:
        logger.warning("waiting for another export %s to finish, up to %.0fs", holder(fd), REBUILD_WAIT_S)

    def busy(fd: int) -> str:
        return (
            f"another export {holder(fd)} was in progress, holding {lock} for {REBUILD_WAIT_S:.0f}s: "
            "try again when it ends"
        )

    with exclusive(lock, REBUILD_WAIT_S, busy, waiting) as fd:
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, orjson.dumps({"version": version, "pid": os.getpid()}), 0)
        except OSError as exc:  # the lock holds; only the note for others is missing
            logger.warning("cannot note the export rebuild path=%s error=%s", lock, exc)
        yield


def build_missing_export(store: SnapshotStore, version: int) -> Path | None:
    """The ``build_export`` of `SnapshotStore.promote`.

    Export ``version`` if it has no export yet; None for a version holding no model
    configuration (written outside the learner loop: there is nothing to export, and promotion
    goes on without an export).

    Raises:
        InvalidSnapshot: the version failed a check.
        NotExportable: its learner type has no exporter.
        SnapshotWriteError: the export could not be written.
    """
    if not isinstance(store.manifest(version).config.get("model"), dict):
        return None
    return export_snapshot(store, version)


def write_export(learner: Learner, target: Path, version: int, learner_type: str = DEFAULT_LEARNER) -> Path:
    """Write ``learner``'s export (a table model's: graph, id tables, contract) to ``target`` atomically.

    Raises:
        NotExportable: the learner cannot be exported (nothing is left behind).
        SnapshotWriteError: the export could not be written (nothing is left behind).
    """
    return _write(exporter(learner, learner_type), learner_type, target, version)


def _write(write: Exporter, learner_type: str, target: Path, version: int) -> Path:
    parent = target.parent
    tmp = temporary(parent)
    try:
        parent.mkdir(parents=True, exist_ok=True)
        os.chmod(parent, _DIR_MODE)
        tmp.mkdir()
        os.chmod(tmp, _DIR_MODE)
        write(tmp, version)
        if not (tmp / CONTRACT).is_file():
            raise NotExportable(
                f"learner {learner_type} cannot be exported for serving: its export states no "
                f"scoring contract ({CONTRACT})"
            )
        _seal(tmp, version)
        fault_point("export.before_rename")
        os.rename(tmp, target)
        fsync_path(parent)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if target.is_dir():  # another process exported the same version first
            return target
        raise SnapshotWriteError(f"cannot write export {target}: {exc}") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def prune_exports(store: SnapshotStore) -> list[int]:
    """Delete the exports of versions retention removed, and temporaries a crash left.

    Returns the versions whose exports were deleted.
    """
    folder = store.root / EXPORTS
    if not folder.is_dir():
        return []
    remove_temporaries(folder)
    kept = set(store.versions())
    deleted = []
    for path in folder.iterdir():
        version = parse_version(path.name)
        if version is not None and version not in kept:
            remove_tree(path)
            deleted.append(version)
    return sorted(deleted)


def scoring_graph(learner: TableLearner) -> ScoringGraph:
    """The learner's model with its id statistics as constants, in eval mode."""
    cfg = learner.cfg
    behaviour = [t.name for t in cfg.builtin_tables if t.feature in BEHAVIOUR_FEATURES]
    context = [t.name for t in cfg.builtin_tables if t.feature not in BEHAVIOUR_FEATURES]
    stats = learner.id_stats
    samples = None if stats is None else stats.samples
    positives = None if stats is None else stats.positives
    cls: type[ScoringGraph] = ContextScoringGraph if context else ScoringGraph
    if learner.plan.input_keys:
        cls = FeatureContextScoringGraph if context else FeatureScoringGraph
    graph = cls(learner.model, behaviour, samples, positives)
    graph.eval()
    return graph


def input_specs(cfg: ModelConfig, plan: FeaturePlan | None = None) -> list[Any]:
    """The graph's inputs, in order (see `contract`); the declared features' as one list, last."""
    nb = sum(t.feature in BEHAVIOUR_FEATURES for t in cfg.builtin_tables)
    nc = len(cfg.builtin_tables) - nb
    specs: list[Any] = [
        paddle.static.InputSpec([None, nb], "int64", "targets"),
        paddle.static.InputSpec([None, nb, cfg.sequence_length], "int64", "sequences"),
        paddle.static.InputSpec([None], "int64", "users"),
    ]
    if nc:
        specs.append(paddle.static.InputSpec([None, nc], "int64", "context"))
    if plan is not None and plan.input_keys:
        specs.append([
            paddle.static.InputSpec(i["shape"], i["dtype"], i["name"])
            for i in feature_inputs(plan, cfg.sequence_length)
        ])
    return specs


def _table_export(learner: TableLearner, tmp: Path, version: int) -> None:
    """The exporter of a table model (DIN, DeepFM): its scoring graph, id tables and contract."""
    specs = input_specs(learner.cfg, learner.plan)
    # The graphs are traced once per model shape (`streamrec.serving.traced`), and hold this
    # learner's values until saved. jit.save writes through the path's directory; keep its
    # scratch out of the export.
    # The same function for onnxruntime, when the onnx extra is installed and a layer has
    # another form there (`onnx_forms`; not DeepFM, whose Paddle graph converts as it is).
    forms = not onnx_missing() and bool(onnx_form_layers(learner.model))
    with _TRACED.lock, tempfile.TemporaryDirectory() as scratch:
        graph, in_forms = _TRACED.graphs(learner, specs, scoring_graph, onnx=forms)
        paddle.jit.save(graph, str(Path(scratch) / MODEL_PREFIX), input_spec=specs)
        for produced in Path(scratch).iterdir():
            if produced.suffix in (".json", ".pdiparams", ".pdmodel"):
                shutil.copyfile(produced, tmp / produced.name)
        (tmp / IDS_DIR).mkdir()
        os.chmod(tmp / IDS_DIR, _DIR_MODE)
        for name, idmap in learner.id_maps.items():
            owned_keys, owned_rows = idmap.owned()  # sorted by key, as serving searches them
            keys, rows = ids_files(name)
            np.save(tmp / keys, np.ascontiguousarray(owned_keys), allow_pickle=False)
            np.save(tmp / rows, np.ascontiguousarray(owned_rows.astype(np.int64)), allow_pickle=False)
        doc = contract(learner, version)
        onnx = write_onnx(tmp, doc, None if in_forms is None else _onnx_trace(in_forms, specs, Path(scratch)))
    if onnx is not None:
        doc["onnx"] = onnx
    (tmp / CONTRACT).write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))


def _onnx_trace(graph: ScoringGraph, specs: list[Any], scratch: Path) -> Path:
    """``graph`` saved in ONNX Runtime's forms (`onnx_forms`) under ``scratch``, for conversion."""
    directory = scratch / "onnx"
    with onnx_forms(graph):
        paddle.jit.save(graph, str(directory / MODEL_PREFIX), input_spec=specs)
    return directory


def _seal(tmp: Path, version: int) -> None:
    """Make the export's files world-readable and durable, and record their checksums."""
    files = {}
    for path in sorted(p for p in tmp.rglob("*") if p.is_file()):
        os.chmod(path, _FILE_MODE)
        fsync_path(path)
        files[path.relative_to(tmp).as_posix()] = sha256_file(path)
    for folder in sorted(p for p in tmp.rglob("*") if p.is_dir()):
        os.chmod(folder, _DIR_MODE)
        fsync_path(folder)
    raw = orjson.dumps({"version": version, "files": files}, option=orjson.OPT_INDENT_2)
    (tmp / MANIFEST).write_bytes(raw)
    (tmp / MANIFEST_SUM).write_text(f"{hashlib.sha256(raw).hexdigest()}  {MANIFEST}\n")
    for name in (MANIFEST, MANIFEST_SUM):
        os.chmod(tmp / name, _FILE_MODE)
        fsync_path(tmp / name)
    fsync_path(tmp)


# Exporters by learner type (``STREAMREC_MODEL__LEARNER``); other learners export themselves.
# DIN and DeepFM take the same inputs, so one scoring graph and contract serve both.
EXPORTERS: dict[str, Callable[[Any, Path, int], None]] = {"din": _table_export, "deepfm": _table_export}
