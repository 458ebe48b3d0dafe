"""Scoring with an export: raw ids in, click probabilities out, through Paddle Inference.

`ExportedModel` is one verified export and its predictor; it follows the export's
``contract.json`` exactly as a serving team's own code would (``examples/score_export.py`` is
the same in 60 lines with no streamrec import). `Scorer` serves the promoted version:
it follows the snapshot directory's serving pointer and swaps in a new version only once it
is loaded, so a request never waits on or fails for a reload.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from paddle import inference

from streamrec.config import ModelConfig, TableConfig
from streamrec.errors import NotServable, SnapshotError
from streamrec.learner.batch import Batch, encode
from streamrec.learner.hashing import PADDING_BUCKET, fingerprint, to_buckets
from streamrec.learner.idmap import DEFAULT_ROW
from streamrec.serving.export import (
    CONTRACT,
    CONTRACT_SCHEMA,
    din_feature_inputs,
    din_request_inputs,
    export_snapshot,
)
from streamrec.snapshots.exports import verify_export
from streamrec.snapshots.manifest import DEFAULT_LEARNER
from streamrec.snapshots.store import SnapshotStore, version_name

logger = logging.getLogger(__name__)

_CHUNK = 4096  # samples per predictor run when scoring a whole batch


@dataclass(frozen=True)
class Candidate:
    """An item to score; without a category it reads the category table's default row."""

    item_id: str
    category_id: str | None = None

    @classmethod
    def parse(cls, text: str) -> Candidate:
        """``item`` or ``item:category``."""
        item, _, category = text.partition(":")
        return cls(item, category or None)


class _Table:
    """How one table turns ids into rows, from the contract and the id tables."""

    def __init__(self, spec: dict[str, Any], export: Path) -> None:
        self.name = spec["name"]
        self.feature = spec["feature"]
        self.dynamic = spec["ids"] == "dynamic"
        self.rows = int(spec["rows"])
        if self.dynamic:  # plain .npy arrays: np.load without pickle runs no code
            self.keys = np.load(export / spec["keys"], allow_pickle=False)
            self.key_rows = np.load(export / spec["key_rows"], allow_pickle=False)

    def rows_of(self, ids: Sequence[str | None]) -> np.ndarray:
        """int64 rows of raw ids.

        None (an unknown category) reads the default row of a dynamic table and padding (zeros)
        of a hashed one.
        """
        out = np.full(len(ids), DEFAULT_ROW if self.dynamic else PADDING_BUCKET, np.int64)
        present = [k for k, i in enumerate(ids) if i is not None]
        out[present] = self.rows_of_keys(fingerprint([i for i in ids if i is not None]))
        return out

    def rows_of_keys(self, keys: np.ndarray) -> np.ndarray:
        """int64 rows of id fingerprints; an id without a row of its own reads the default."""
        if not self.dynamic:
            return to_buckets(keys, self.rows)
        out = np.full(len(keys), DEFAULT_ROW, np.int64)
        if len(self.keys):
            at = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
            hit = self.keys[at] == keys
            out[hit] = self.key_rows[at[hit]]
        return out


class ExportedModel:
    """One export directory: its checksums verified, its predictor ready."""

    def __init__(self, path: Path, threads: int = 1) -> None:
        """Load the export at ``path``.

        Raises:
            InvalidSnapshot: a file is missing or does not match its checksum.
            NotServable: another learner's export (its contract is not DIN's).
        """
        self.path = Path(path)
        verify_export(self.path)
        self.contract: dict[str, Any] = orjson.loads((self.path / CONTRACT).read_bytes())
        model = self.contract.get("model")
        learner = model.get("learner", DEFAULT_LEARNER) if isinstance(model, dict) else None
        if self.contract.get("schema") != CONTRACT_SCHEMA or learner != DEFAULT_LEARNER:
            raise NotServable(
                f"{self.path} is not a DIN export: streamrec serves DIN's exports only; score "
                f"another learner's as its {CONTRACT} says"
            )
        self.version: int = self.contract["version"]
        self.tables = [_Table(t, self.path) for t in self.contract["tables"]]
        self.behaviour = [t for t in self.tables if t.feature in ("item", "category")]
        self.context = [t for t in self.tables if t.feature not in ("item", "category")]
        self.length = int(self.contract["sequence_length"])
        self._cfg = ModelConfig.model_validate(self.contract["model"])
        self._by_name = {t.name: t for t in self.tables}
        self.user_buckets = int(self.contract["user_buckets"])
        config = inference.Config(str(self.path / "model.json"), str(self.path / "model.pdiparams"))
        config.disable_gpu()
        config.enable_mkldnn()  # oneDNN: Paddle's fast CPU kernels
        config.set_cpu_math_library_num_threads(threads)
        config.disable_glog_info()
        self._predictor = inference.create_predictor(config)
        self._lock = threading.Lock()  # one predictor runs one request at a time

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
        features, by name (any other declared feature reads absent).
        """
        recent = list(history)[-self.length :]
        sequences = np.full((1, len(self.behaviour), self.length), PADDING_BUCKET, np.int64)
        targets = np.empty((len(candidates), len(self.behaviour)), np.int64)
        for col, table in enumerate(self.behaviour):
            if table.feature == "item":
                seq_ids: list[str | None] = [item for item, _ in recent]
                target_ids: list[str | None] = [c.item_id for c in candidates]
            else:
                seq_ids = [category for _, category in recent]
                target_ids = [c.category_id for c in candidates]
            if recent:
                sequences[0, col, self.length - len(recent) :] = table.rows_of(seq_ids)
            targets[:, col] = table.rows_of(target_ids)
        n = len(candidates)
        inputs = {
            "targets": targets,
            "sequences": np.repeat(sequences, n, axis=0),
            "users": np.repeat(to_buckets(fingerprint([user_id]), self.user_buckets), n),
        }
        if self.context:
            inputs["context"] = np.repeat(
                np.stack([t.rows_of([user_id]) for t in self.context], axis=1), n, axis=0
            )
        # Declared features (export.py): the request's context, the rest absent.
        inputs.update(din_request_inputs(self.contract, user_id, [c.item_id for c in candidates], context))
        return self._run(inputs)

    def score_batch(self, batch: Batch) -> np.ndarray:
        """float64 [B].

        A learner's batch scored by the export, each sample with its own history (the gate
        compares the served version with a candidate this way).
        """
        encoded = encode(batch, self._cfg, rows_of=self._rows_of_table)
        inputs = {
            "targets": np.stack([encoded.targets[t.name] for t in self.behaviour], axis=1),
            "sequences": np.stack([encoded.sequences[t.name] for t in self.behaviour], axis=1),
            "users": to_buckets(fingerprint(batch.user_ids.tolist()), self.user_buckets),
        }
        if self.context:
            inputs["context"] = np.stack([encoded.context[t.name] for t in self.context], axis=1)
        inputs.update(din_feature_inputs(self.contract, batch))  # declared features (export.py)
        out = np.empty(len(batch), np.float64)
        for start in range(0, len(batch), _CHUNK):
            part = {k: v[start : start + _CHUNK] for k, v in inputs.items()}
            out[start : start + _CHUNK] = self._run(part)
        return out

    def _rows_of_table(self, table: TableConfig, keys: np.ndarray) -> np.ndarray:
        return self._by_name[table.name].rows_of_keys(keys)

    def _run(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        with self._lock:
            for name in self._predictor.get_input_names():
                handle = self._predictor.get_input_handle(name)
                array = np.ascontiguousarray(inputs[name])
                handle.reshape(array.shape)
                handle.copy_from_cpu(array)
            self._predictor.run()
            output = self._predictor.get_output_handle(self._predictor.get_output_names()[0])
            return np.asarray(output.copy_to_cpu(), np.float32)


class Scorer:
    """Scores with the promoted version of a snapshot directory, following its pointer.

    ``current`` is the version the pointer last named (None when unreadable) and
    ``load_failures`` counts failed loads; `serves_current` says whether the two agree.
    A failure is logged once, when it first happens or changes, then only counted.
    """

    def __init__(self, root: Path, threads: int = 1) -> None:
        """Load the version ``<root>/serving/CURRENT`` names (exporting it if needed).

        When it cannot be loaded, the newest promoted version that can, with a warning.

        Raises:
            SnapshotError: nothing is promoted, or no promoted version can be loaded.
        """
        self.store = SnapshotStore(root)
        self._threads = threads
        self._reload_lock = threading.Lock()
        self.current: int | None = None
        self.load_failures = 0
        self._failure: tuple[int | None, str] | None = None  # the last one logged
        self.model = self._start()

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
        return ExportedModel(export_snapshot(self.store, version), self._threads)

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
                "cannot serve %s, serving version=%s instead (the newest promoted version that "
                "loads) error=%s", named, version_name(version), error,
            )
            self._failed(self.current, error, log=False)
            return model
        raise error

    def _fallbacks(self) -> list[int]:
        """Every promoted version but the current one, newest first."""
        try:
            promoted = {e.version for e in self.store.history()}
        except SnapshotError:
            return []
        return sorted(promoted - {self.current}, reverse=True)

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
            logger.info("serving version=%s", version_name(current))
            return True
