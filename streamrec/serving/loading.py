"""What `streamrec serve` reads of an export before an engine runs it, with no Paddle imported.

`read_export` is serving's own load (`streamrec.serving.scorer.ExportedModel` runs it, then opens
the engine): every checksum, the contract as the scorer reads it, the Paddle graph's files and
each dynamic table's id arrays. `load_problem` asks the same of an export for the snapshot
commands (`snapshot verify`, `list`, `promote`) and the gate, so they call an export whole only
when serve would load it, and say why not in one line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from streamrec.config import BEHAVIOUR_FEATURES, ModelConfig
from streamrec.errors import InvalidSnapshot, NotServable
from streamrec.learner.hashing import PADDING_BUCKET, fingerprint, to_buckets
from streamrec.learner.idmap import DEFAULT_ROW
from streamrec.serving.contract import CONTRACT, servable_inputs
from streamrec.snapshots.exports import ExportCheck, export_dir, verify_export

# The Paddle graph every export holds (`streamrec.serving.engines.PaddleEngine` runs it; the
# ONNX graph, when there is one, is optional: serving falls back to this one).
PADDLE_FILES = ("model.json", "model.pdiparams")


class IdTable:
    """How one table turns ids into rows, from the contract and the id tables."""

    def __init__(self, spec: dict[str, Any], export: Path) -> None:
        """The table ``spec`` (a contract's ``tables`` entry) of the export at ``export``.

        Raises:
            InvalidSnapshot: a dynamic table's id arrays cannot be looked up (not 1-D, keys
                not sorted and unique, lengths that differ, rows outside the table).
        """
        self.name = spec["name"]
        self.feature = spec["feature"]
        self.kind = spec.get("kind") or ("behaviour" if self.feature in BEHAVIOUR_FEATURES else "context")
        self.dynamic = spec["ids"] == "dynamic"
        self.rows = int(spec["rows"])
        if self.dynamic:  # plain .npy arrays: np.load without pickle runs no code
            self.keys = np.load(export / spec["keys"], allow_pickle=False)
            self.key_rows = np.load(export / spec["key_rows"], allow_pickle=False)
            problem = self._ids_problem()
            if problem is not None:
                raise InvalidSnapshot(f"{export / spec['keys']}, {spec['key_rows']}: {problem}")

    def _ids_problem(self) -> str | None:
        """Why the id arrays would score wrongly or fail a request, or None."""
        keys, rows = self.keys, self.key_rows
        if keys.ndim != 1 or rows.ndim != 1 or keys.dtype != np.uint64 or rows.dtype.kind not in "iu":
            found = f"{keys.dtype}{keys.shape}, {rows.dtype}{rows.shape}"
            return f"not 1-D uint64 keys and integer rows ({found})"
        if len(keys) != len(rows):
            return f"{len(keys)} keys but {len(rows)} rows"
        if len(keys) > 1 and not (keys[1:] > keys[:-1]).all():
            return "the keys are not sorted and unique (a lookup would find the wrong rows)"
        if len(rows) and (rows.min() < 0 or rows.max() >= self.rows):
            return f"rows {rows.min()}..{rows.max()} are outside table {self.name!r} ({self.rows} rows)"
        return None

    def rows_of(self, ids: Sequence[str | None]) -> np.ndarray:
        """int64 rows of raw ids.

        None (an unknown category) reads the default row of a dynamic table and padding (zeros)
        of a hashed one.
        """
        if None not in ids:  # every id given: a request's items, a history
            return self.rows_of_keys(fingerprint(ids))  # type: ignore[arg-type]  # no None in it
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


@dataclass(frozen=True)
class ExportContents:
    """An export as serving reads it before its engine: the contract and the tables it names."""

    path: Path
    contract: dict[str, Any]
    inputs: list[dict[str, Any]]  # the contract's, each with its source (`servable_inputs`)
    version: int
    tables: list[IdTable]
    sequence_length: int
    user_buckets: int
    model: ModelConfig


def read_export(path: Path) -> ExportContents:
    """Read the export at ``path`` as `streamrec serve` does before running it.

    Raises:
        InvalidSnapshot: a file is missing, unreadable or fails its checksum, the contract or
            an id table cannot be served from, or a file of the Paddle graph is not the export's.
        NotServable: its contract declares an input this scorer cannot build (another
            learner's export, scored as its ``contract.json`` says).
    """
    files = verify_export(path)
    try:
        contract: dict[str, Any] = orjson.loads((path / CONTRACT).read_bytes())
        inputs = servable_inputs(contract, path)
        contents = ExportContents(
            path, contract, inputs, int(contract["version"]), [IdTable(t, path) for t in contract["tables"]],
            int(contract["sequence_length"]), int(contract["user_buckets"]),
            ModelConfig.recorded(contract["model"]),
        )
    except (KeyError, ValueError, TypeError, OSError, AttributeError) as exc:  # ValueError: JSON too
        why = " ".join(f"{type(exc).__name__}: {exc}".split())  # pydantic's message spans lines
        raise InvalidSnapshot(f"{path / CONTRACT} cannot be served from ({why})") from exc
    missing = [name for name in PADDLE_FILES if name not in files]
    if missing:
        raise InvalidSnapshot(f"{path} lacks {', '.join(missing)} (its manifest lists none)")
    return contents


@dataclass(frozen=True)
class LoadProblem:
    """Why `streamrec serve` would not load an export."""

    message: str  # one line, naming the file
    own: bool  # another learner's own export (whole, scored by a server of the team's own), not damage


def load_problem(path: Path) -> LoadProblem | None:
    """Why `streamrec serve` would not load the export at ``path`` (`read_export`), or None."""
    try:
        read_export(path)
    except NotServable as exc:
        return LoadProblem(str(exc), own=True)
    except InvalidSnapshot as exc:
        return LoadProblem(str(exc), own=False)
    return None


def check_loads(root: Path, version: int) -> ExportCheck:
    """Whether ``version``'s export under ``root`` is there, whole, and loaded by `streamrec serve`.

    Missing or failing a checksum reads as `check_export` says (`read_export` verifies first);
    for one whose checksums hold, ``problem`` says why serve would not load it and ``own``
    whether it is another learner's own export.
    """
    return read_checked(root, version)[0]


def read_checked(root: Path, version: int) -> tuple[ExportCheck, ExportContents | None]:
    """`check_loads`, with what `read_export` read of the export when serve would load it.

    Each file is hashed once, for both answers.
    """
    path = export_dir(root, version)
    if not path.is_dir():
        return ExportCheck(version, path, missing=True, problem=None), None
    try:
        contents = read_export(path)
    except NotServable as exc:
        return ExportCheck(version, path, missing=False, problem=str(exc), own=True), None
    except InvalidSnapshot as exc:
        return ExportCheck(version, path, missing=False, problem=str(exc)), None
    return ExportCheck(version, path, missing=False, problem=None), contents


def serve_check(root: Path) -> Callable[[int], ExportCheck]:
    """Promotion's check (`streamrec.snapshots.promotion.ServeCheck`) of the exports under ``root``.

    `check_loads`, which verifies each file as it reads, so promotion hashes them once.
    """
    return partial(check_loads, root)
