"""Scoring with an export: raw ids in, click probabilities out, through ONNX Runtime or Paddle Inference.

`ExportedModel` is one verified export and its engine (`streamrec.serving.engines`); it follows the export's
``contract.json`` exactly as a serving team's own code would (``examples/score_export.py`` is
the same in 60 lines with no streamrec import). `Scorer` serves the promoted version:
it follows the snapshot directory's serving pointer and swaps in a new version only once it
is loaded, so a request never waits on or fails for a reload.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from streamrec.config import TableConfig
from streamrec.errors import InvalidSnapshot, SnapshotError
from streamrec.features.schema import FeatureSchema
from streamrec.learner.columns import SampleColumns, encode, require_columns
from streamrec.learner.hashing import PADDING_BUCKET, fingerprint, to_buckets
from streamrec.observability.freshness import LoadedVersion, loaded_version
from streamrec.serving.batching import Combiner
from streamrec.serving.contract import feature_batch_inputs
from streamrec.serving.drift import RequestDrift
from streamrec.serving.engines import Engine, EngineChoice, open_engine
from streamrec.serving.export import export_snapshot
from streamrec.serving.features import PAIR, candidate_columns, feature_request_inputs
from streamrec.serving.features import Candidate as Candidate  # its home before; still imported from here
from streamrec.serving.loading import ExportContents, read_export
from streamrec.serving.probe import require_finite_scores
from streamrec.snapshots.directory import parse_version
from streamrec.snapshots.exports import CONTRACT, EXPORTS, MANIFEST, rebuild_hint
from streamrec.snapshots.pointer import require_root
from streamrec.snapshots.store import SnapshotStore, version_name

logger = logging.getLogger(__name__)

_CHUNK = 4096  # samples per predictor run when scoring a whole batch


class ExportedModel:
    """One export directory: its checksums verified, its engine ready."""

    def __init__(
        self, path: Path, threads: int = 1, batch_candidates: int = 0, engine: EngineChoice = "auto"
    ) -> None:
        """Load the export at ``path``, run by ``engine`` (`streamrec.serving.engines`).

        Requests scored at once on several threads queue for the one predictor; those waiting
        run as one call of up to ``batch_candidates`` candidates (0: each alone; see
        `streamrec.serving.batching`).

        Raises:
            InvalidSnapshot: no directory ``path`` or a snapshot's own (not its export), a file
                is missing or does not match its checksum, the contract
                or an id table cannot be served from (`streamrec.serving.loading.read_export`),
                or the engine cannot load the graph or scores a probe batch as NaN or infinity.
            NotServable: its contract declares an input this scorer cannot build (another
                learner's export, scored as its ``contract.json`` says).
        """
        self.path = Path(path)
        _require_export_directory(self.path)
        try:
            self._read(read_export(self.path))
            self._engine = open_engine(self.path, self.contract, engine, threads)
            require_finite_scores(self._engine, self.contract, self.path)
        except InvalidSnapshot as exc:  # what the export's snapshot mends
            raise InvalidSnapshot(f"{exc}: {rebuild_hint(parse_version(self.path.name))}") from exc
        self.engine: str = self._engine.name  # "onnx" or "paddle": the engine that runs it
        self._lock = threading.Lock()  # one engine runs one request at a time
        # Not the bound ``self._run``: the model would hold itself, freed only by a full collection.
        self.combiner = Combiner(partial(_run, self._engine, self._lock), batch_candidates)

    def __repr__(self) -> str:
        """The version, the engine running it and the export's path."""
        return f"ExportedModel(version={self.version}, engine={self.engine!r}, path={str(self.path)!r})"

    def _read(self, contents: ExportContents) -> None:
        """What scoring needs of the export, as `read_export` read it."""
        self.contract: dict[str, Any] = contents.contract
        self.inputs = contents.inputs
        self.version: int = contents.version
        self.tables = contents.tables
        self.behaviour = [t for t in self.tables if t.kind == "behaviour"]
        self.context = [t for t in self.tables if t.kind == "context"]
        self.length = contents.sequence_length
        self._cfg = contents.model
        self._by_name = {t.name: t for t in self.tables}
        self.user_buckets = contents.user_buckets
        schema = self.contract.get("feature_schema")
        self.drift = RequestDrift(FeatureSchema.from_json(schema) if schema else None, self.version)

    def score(
        self,
        user_id: str,
        history: Sequence[tuple[str, str]],
        candidates: Sequence[Candidate],
        context: Mapping[str, object] | None = None,
    ) -> np.ndarray:
        """float32 [len(candidates)].

        Each candidate's click probability for a user whose behaviours, oldest first, are
        ``history`` ((item, category) pairs); ``context`` gives the request's declared context
        features, by name, and each candidate its own behaviour features. A
        `StoredHistory` (what the stores hold) also gives the behaviour features along the
        history and the user's features, a `GivenHistory` (a request's own) the behaviour
        features along it; any other declared feature reads absent.

        Raises:
            InvalidEvent: a request's feature value breaks its declaration.
            TypeError: a behaviour is not an (item, category) pair of str, a candidate not a
                `Candidate` of str ids, or ``user_id`` not a str.
        """
        if not isinstance(user_id, str):
            raise TypeError(f"user_id is a str, not {user_id!r}")  # MovieLens's ids are numbers
        recent = list(history)[-self.length :]
        if (odd := next((p for p in recent if not _str_pair(p)), None)) is not None:
            if not isinstance(odd, tuple | list) or len(odd) != 2:  # "i2" would read as i, 2
                raise TypeError(f"history holds (item, category) pairs, not {odd!r}")
            raise TypeError(f"history holds (item, category) pairs of str, not {tuple(odd)!r}")
        n = len(candidates)
        columns = candidate_columns(candidates)
        targets, sequences = {}, {}
        for table in self.behaviour:
            at = PAIR.index(table.feature)
            seq_ids: list[str | None] = [pair[at] for pair in recent]
            target_ids = columns[table.feature]
            sequence = np.full((1, self.length), PADDING_BUCKET, np.int64)
            if recent:
                sequence[0, self.length - len(recent) :] = table.rows_of(seq_ids)
            sequences[table.name] = np.repeat(sequence, n, axis=0)
            targets[table.name] = table.rows_of(target_ids)
        rows = {t.name: np.repeat(t.rows_of([user_id]), n) for t in self.context}
        users = np.repeat(to_buckets(fingerprint([user_id]), self.user_buckets), n)
        # Declared features: the stores' and the request's, the rest absent (feature_request_inputs).
        self.drift.observe(candidates, context, history)  # warns of names given and ignored
        features = feature_request_inputs(self.contract, user_id, candidates, context, history)
        return self.combiner(self._feed(targets, sequences, rows, users, features))

    def score_batch(self, batch: SampleColumns) -> np.ndarray:
        """float64 [B].

        A learner's batch scored by the export, each sample with its own history (the gate
        compares the served version with a candidate this way).

        Raises:
            TypeError: ``batch`` is not a `SampleColumns`.
        """
        encoded = encode(require_columns(batch), self._cfg, rows_of=self._rows_of_table)
        users = to_buckets(fingerprint(batch.user_ids.tolist()), self.user_buckets)
        features = feature_batch_inputs(self.contract, batch)
        inputs = self._feed(encoded.targets, encoded.sequences, encoded.context, users, features)
        out = np.empty(len(batch), np.float64)
        for start in range(0, len(batch), _CHUNK):
            part = {k: v[start : start + _CHUNK] for k, v in inputs.items()}
            out[start : start + _CHUNK] = self._run(part)
        return out

    def _feed(
        self,
        targets: Mapping[str, np.ndarray],
        sequences: Mapping[str, np.ndarray],
        context: Mapping[str, np.ndarray],
        users: np.ndarray,
        features: Mapping[str, np.ndarray],
    ) -> dict[str, np.ndarray]:
        """The predictor's inputs as the contract declares them, from rows per table name.

        ``targets`` and ``context`` hold [B] rows, ``sequences`` [B, T], ``users`` the [B]
        statistics buckets, ``features`` the declared features' encoded inputs by
        ``<feature>/<side>``; each declared input stacks its ``columns`` in their order.
        """
        feed = {}
        for spec in self.inputs:
            source, columns = spec["source"], spec.get("columns", ())
            if source == "user_bucket":
                array = users
            elif source == "feature":
                array = features[f"{spec['feature']}/{spec['side']}"]
            else:
                rows = {"target_rows": targets, "sequence_rows": sequences, "context_rows": context}
                by_table = rows[source]
                array = np.stack([by_table[c] for c in columns], axis=1)
            feed[spec["name"]] = array.astype(spec["dtype"], copy=False)
        return feed

    def _rows_of_table(self, table: TableConfig, keys: np.ndarray) -> np.ndarray:
        return self._by_name[table.name].rows_of_keys(keys)

    def _run(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        return _run(self._engine, self._lock, inputs)


def _run(engine: Engine, lock: threading.Lock, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
    """``engine``'s outputs for ``inputs``, one run at a time."""
    with lock:
        return engine.run(inputs)


def _require_export_directory(path: Path) -> None:
    """Refuse a ``path`` that is no export at all (not a damaged one: that is rebuilt).

    Raises:
        InvalidSnapshot: no directory ``path``, or a snapshot's own directory, not its export.
    """
    if not path.is_dir():
        raise InvalidSnapshot(
            f"no export directory {path}: give an export's directory (<snapshot dir>/exports/v000007, "
            "which export_snapshot returns)"
        )
    version = parse_version(path.name)
    snapshot = (path / MANIFEST).exists() and not (path / CONTRACT).exists() and path.parent.name != EXPORTS
    if version is not None and snapshot:
        raise InvalidSnapshot(
            f"{path} is snapshot version {version}, not its export: export_snapshot(store, {version}) "
            f"writes and returns {path.parent / EXPORTS / path.name}"
        )


class Scorer:
    """Scores with the promoted version of a snapshot directory, following its pointer.

    ``current`` is the version the pointer last named (None when unreadable) and
    ``load_failures`` counts failed loads; `serves_current` says whether the two agree.
    A failure is logged once, when it first happens or changes, then only counted.
    """

    def __init__(
        self, root: Path, threads: int = 1, batch_candidates: int = 0, engine: EngineChoice = "auto"
    ) -> None:
        """Load the version ``<root>/serving/CURRENT`` names (exporting it if needed).

        ``threads``, ``batch_candidates`` and ``engine`` are each loaded version's (`ExportedModel`).

        When it cannot be loaded, the first version a rollback would take that can (never one
        rolled back from), with a warning.

        Raises:
            SnapshotError: no directory ``root``, nothing promoted, or no promoted version loads.
        """
        require_root(root)  # a mistyped directory is named as such, not as nothing promoted
        self.store = SnapshotStore(root)
        self._threads = threads
        self._batch_candidates = batch_candidates
        self.engine_choice: EngineChoice = engine
        self._reload_lock = threading.Lock()
        self.current: int | None = None
        self.load_failures = 0
        self._failure: tuple[int | None, str] | None = None  # the last one logged
        self.loaded: LoadedVersion | None = None  # the last version loaded, for freshness
        self.model = self._start()

    def __repr__(self) -> str:
        """The snapshot directory, the version served, the one the pointer names, the failed loads."""
        return (
            f"Scorer(root={str(self.store.root)!r}, version={self.version}, current={self.current}, "
            f"load_failures={self.load_failures})"
        )

    @property
    def version(self) -> int:
        """The version being served."""
        return self.model.version

    @property
    def serves_current(self) -> bool:
        """Whether the served version is the one the pointer names."""
        return self.current == self.model.version

    def _current(self) -> int:
        current = self.store.current()
        if current is None:
            raise SnapshotError(
                f"no promoted version in {self.store.root}: run `streamrec snapshot promote VERSION`"
            )
        return current

    def _load(self, version: int) -> ExportedModel:
        path = export_snapshot(self.store, version)
        model = ExportedModel(path, self._threads, self._batch_candidates, self.engine_choice)
        self.loaded = loaded_version(self.store, version)
        return model

    def _start(self) -> ExportedModel:
        try:
            self.current = self._current()
            return self._load(self.current)
        except SnapshotError as exc:
            error = exc
        for version in self._fallbacks():
            try:
                model = self._load(version)
            except SnapshotError as exc:
                logger.warning("cannot load promoted version=%s error=%s", version_name(version), exc)
                continue
            named = "CURRENT" if self.current is None else version_name(self.current)
            logger.warning(
                "cannot serve %s, serving version=%s instead (the first a rollback would take that "
                "loads) error=%s", named, version_name(version), error,
            )
            self._failed(self.current, error, log=False)
            return model
        raise error

    def _fallbacks(self) -> list[int]:
        """The versions a rollback from the current one would take, in its order.

        Never one rolled back from (an operator rejected it); with an unreadable pointer, every
        version served before, the last one first.
        """
        try:
            return self.store.serving.rollback_candidates(self.current)
        except SnapshotError:
            return []

    def _failed(self, version: int | None, exc: SnapshotError, log: bool = True) -> None:
        self.load_failures += 1
        key = (version, str(exc))
        if key == self._failure:
            return
        self._failure = key
        if log:
            named = "unreadable pointer" if version is None else f"promoted version={version_name(version)}"
            logger.error(
                "cannot load %s, keeping version=%s (logged once; retries counted in "
                "streamrec_serving_load_failures_total) error=%s",
                named, version_name(self.model.version), exc,
            )

    def refresh(self) -> bool:
        """Swap in the promoted version if the pointer moved; True when it did.

        The new version is loaded and verified before the swap; requests meanwhile score
        with the old one. A version that fails to load is logged once and the old one kept.
        """
        with self._reload_lock:
            try:
                current = self._current()
            except SnapshotError as exc:
                self.current = None
                self._failed(None, exc)
                return False
            self.current = current
            if current == self.model.version:
                self._failure = None
                return False
            try:
                model = self._load(current)
            except SnapshotError as exc:
                self._failed(current, exc)
                return False
            self._failure = None
            self.model = model  # one reference swap: a request holds the model it started with
            logger.info("serving version=%s engine=%s", version_name(current), model.engine)
            return True


def _str_pair(pair: object) -> bool:
    """Whether ``pair`` is an (item, category) pair of str: one test of a behaviour on a request's path."""
    if not isinstance(pair, tuple | list) or len(pair) != 2:
        return False
    return isinstance(pair[0], str) and isinstance(pair[1], str)
