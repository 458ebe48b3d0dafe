"""A version's export as the snapshot directory sees it: where it lives, whether it is whole.

The export itself (a Paddle Inference model, id tables, ``contract.json``) is written by
`streamrec.serving.export`; this module only reads files, so the snapshot store can refuse
to promote a version whose export is damaged without importing Paddle. An export is whole when
its ``manifest.json`` matches ``manifest.sha256`` and every file matches its checksum there.
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from streamrec.errors import InvalidSnapshot
from streamrec.fileio import sha256_file
from streamrec.snapshots.directory import parse_version, version_name

EXPORTS = "exports"
MANIFEST = "manifest.json"
MANIFEST_SUM = "manifest.sha256"
CONTRACT = "contract.json"  # the scoring contract (`streamrec.serving.contract`)


def onnx_missing() -> list[str]:
    """The modules an export's ONNX graph needs that are not installed (the ``onnx`` extra's).

    Here, not in serving, since the learner sizes its exports by it too.
    """
    return [m for m in ("paddle2onnx", "onnxruntime") if importlib.util.find_spec(m) is None]


def export_dir(root: Path, version: int) -> Path:
    """Where the export of ``version`` of the snapshots under ``root`` lives."""
    return Path(root) / EXPORTS / version_name(version)


def verify_export(path: Path) -> dict[str, str]:
    """Check an export's manifest and every file's checksum; return the files' digests.

    Raises:
        InvalidSnapshot: naming the file that is missing or does not match.
    """
    manifest = path / MANIFEST
    try:
        raw = manifest.read_bytes()
        recorded = (path / MANIFEST_SUM).read_text().split()[:1]
    except (OSError, UnicodeDecodeError) as exc:
        where = getattr(exc, "filename", None) or manifest
        raise InvalidSnapshot(f"{where} is missing or unreadable") from exc
    if recorded != [hashlib.sha256(raw).hexdigest()]:
        raise InvalidSnapshot(f"{manifest} does not match its checksum in {MANIFEST_SUM}")
    files: dict[str, str] = orjson.loads(raw)["files"]
    for name, digest in files.items():
        try:
            ok = sha256_file(path / name) == digest
        except OSError as exc:
            raise InvalidSnapshot(f"{path / name} is missing or unreadable") from exc
        if not ok:
            raise InvalidSnapshot(f"{path / name} does not match its checksum")
    if CONTRACT in files:  # checksums hold for a contract resealed after an edit, or another release's
        problem = contract_problem(path / CONTRACT, files)
        if problem is not None:
            raise InvalidSnapshot(f"{path / CONTRACT} {problem}")
    return files


# What serving reads of a contract before anything else, by key: the JSON type it must be.
_CONTRACT_FIELDS = {"version": int, "sequence_length": int, "user_buckets": int, "tables": list,
                    "inputs": list, "model": dict}


def contract_problem(contract: Path, files: Mapping[str, str]) -> str | None:
    """Why an export's ``contract.json`` cannot be served from (its shape, not its meaning), or None.

    Every contract is a JSON object; one that declares its ``schema`` and ``inputs`` (the table
    models' form, which `streamrec serve` scores) has the fields serving reads first, each input
    a name, a numeric dtype and a shape (serving casts what it feeds to that dtype), and
    ``files`` (the export's) hold every id table it names. A learner that exports itself may
    state another form, ``inputs`` of its own included: serving refuses it as not servable.
    """
    try:
        doc = orjson.loads(contract.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        return f"is unreadable or not JSON: {exc}"
    if not isinstance(doc, dict):
        return "is not a JSON object"
    if "inputs" not in doc or "schema" not in doc:
        return None  # a learner's own contract: scored as it says (`streamrec serve` refuses it)
    for key, kind in _CONTRACT_FIELDS.items():
        value = doc.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            return f"has no {kind.__name__} {key!r} (it reads {str(value)[:40]!r})"
    problems = (_input_problem(spec) for spec in doc["inputs"])
    if (problem := next((p for p in problems if p is not None), None)) is not None:
        return problem
    for table in doc["tables"]:
        if not isinstance(table, dict) or not isinstance(table.get("name"), str):
            return f"lists a table that is not an object with a name: {str(table)[:60]!r}"
        if table.get("ids") != "dynamic":
            continue
        for key in ("keys", "key_rows"):
            if table.get(key) not in files:
                name = table.get(key)
                return f"names {name!r} as table {table['name']!r}'s {key}, not a file of the export"
    return None


def _input_problem(spec: object) -> str | None:
    """Why one of a contract's ``inputs`` cannot be fed (no name, numeric dtype or shape), or None."""
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        return f"lists an input that is not an object with a name: {str(spec)[:60]!r}"
    dtype = spec.get("dtype")
    try:
        numeric = isinstance(dtype, str) and np.dtype(dtype).kind in "biuf"
    except TypeError:  # not a dtype numpy knows ('int999')
        numeric = False
    if not numeric:
        return f"gives input {spec['name']!r} no numeric dtype (it reads {str(dtype)[:40]!r})"
    if not isinstance(spec.get("shape"), list):
        return f"gives input {spec['name']!r} no shape (it reads {str(spec.get('shape'))[:40]!r})"
    return None


@dataclass(frozen=True)
class ExportCheck:
    """What a version's export is: missing, damaged (``problem`` names the file) or whole.

    `streamrec.serving.loading.check_loads` also asks whether serve would load a whole one:
    ``problem`` then says why not, and ``own`` whether it is another learner's own export.
    """

    version: int
    path: Path
    missing: bool
    problem: str | None  # why a present export is damaged; None when it is whole (or missing)
    own: bool = False  # whole, but another learner's own, which `streamrec serve` does not load

    @property
    def whole(self) -> bool:
        """Present and every checksum matching."""
        return not self.missing and self.problem is None


def check_export(root: Path, version: int) -> ExportCheck:
    """Whether ``version``'s export under ``root`` is there and whole (every file hashed)."""
    path = export_dir(root, version)
    if not path.is_dir():
        return ExportCheck(version, path, missing=True, problem=None)
    try:
        verify_export(path)
    except InvalidSnapshot as exc:
        return ExportCheck(version, path, missing=False, problem=str(exc))
    return ExportCheck(version, path, missing=False, problem=None)


def refuse_unservable(check: ExportCheck) -> None:
    """Raise unless the export is whole; the message says which command mends it.

    Raises:
        InvalidSnapshot: the export is missing, or a file of it is (naming the file).
    """
    name = version_name(check.version)
    if check.missing:
        raise InvalidSnapshot(
            f"{name} has no export ({check.path}): build it with `streamrec snapshot export {check.version}`"
        )
    if check.problem is not None:
        raise InvalidSnapshot(
            f"the export of {name} is damaged: {check.problem}: {rebuild_hint(check.version)}"
        )


def rebuild_hint(version: int | None) -> str:
    """How an operator mends a damaged export: rebuild it from its snapshot."""
    number = "VERSION" if version is None else version
    return f"rebuild it with `streamrec snapshot export {number} --rebuild`"


def export_bytes(root: Path) -> int:
    """The size of the newest export under ``root`` (0 when there is none).

    What the next export will need, near enough (the model's shape rarely changes between
    versions).
    """
    folder = Path(root) / EXPORTS
    try:
        versions = sorted(v for p in folder.iterdir() if (v := parse_version(p.name)) is not None)
    except OSError:
        return 0
    if not versions:
        return 0
    newest = folder / version_name(versions[-1])
    try:
        return sum(p.stat().st_size for p in newest.rglob("*") if p.is_file())
    except OSError:
        return 0
