"""`snapshot verify`, `list`, `promote` and `export --rebuild` ask what `streamrec serve` asks of an export.

Found by the snapshot tools tour: an export whose files were edited and resealed (a contract of
another form, the Paddle weights dropped from it, a contract serve cannot read, id arrays that
disagree) passed `snapshot verify` and `list` ("ok", exit 0), was promoted, and then `streamrec
serve` refused it at load, or loaded it and failed each request (ids), answered NaN (no
weights) or scored wrong rows (unsorted keys).
"""

from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner, Result

from streamrec.cli import app
from streamrec.errors import InvalidSnapshot, NotServable
from streamrec.learner.state import STATE_LAYOUT
from streamrec.snapshots.store import SnapshotStore
from tests.support import trained_snapshots


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two exported versions of a small DIN, written once."""
    return trained_snapshots(tmp_path_factory.mktemp("written"), count=2).root


@pytest.fixture
def root(written: Path, tmp_path: Path) -> Path:
    shutil.copytree(written, tmp_path / "snapshots")
    return tmp_path / "snapshots"


def run(root: Path, *args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(app, ["snapshot", *args, "--snapshot-dir", str(root)])
    assert result.exit_code == code, result.output
    return result


def reseal(export: Path) -> None:
    """Record an export's (or a version's) files' checksums again, as someone editing it would."""
    manifest = orjson.loads((export / "manifest.json").read_bytes())
    manifest["files"] = {
        name: hashlib.sha256((export / name).read_bytes()).hexdigest()
        for name in manifest["files"] if (export / name).is_file()
    }
    raw = orjson.dumps(manifest)
    (export / "manifest.json").write_bytes(raw)
    (export / "manifest.sha256").write_text(f"{hashlib.sha256(raw).hexdigest()}  manifest.json\n")


def _edit_contract(export: Path, change: Callable[[dict[str, Any]], object]) -> None:
    doc = orjson.loads((export / "contract.json").read_bytes())
    change(doc)
    (export / "contract.json").write_bytes(orjson.dumps(doc))


def _own(export: Path) -> None:  # a learner's own contract (`--own-server` promotes it)
    (export / "contract.json").write_bytes(orjson.dumps({"version": 2, "output": "rate.npy[0]"}))


def _no_weights(export: Path) -> None:
    (export / "model.pdiparams").unlink()


def _no_contract(export: Path) -> None:
    (export / "contract.json").unlink()


def _bad_model(export: Path) -> None:
    _edit_contract(export, lambda doc: doc["model"].update(sequence_length="six"))


def _short_rows(export: Path) -> None:
    keys = np.load(export / "ids/item.keys.npy")
    np.save(export / "ids/item.rows.npy", np.arange(2, 2 + len(keys) // 2, dtype=np.int64))


def _unsorted_keys(export: Path) -> None:
    np.save(export / "ids/item.keys.npy", np.load(export / "ids/item.keys.npy")[::-1].copy())


def _rows_outside(export: Path) -> None:
    keys = np.load(export / "ids/item.keys.npy")
    np.save(export / "ids/item.rows.npy", np.full(len(keys), 10**9, np.int64))


DAMAGE = {  # how each is edited, and what verify says of it
    "own-contract": (_own, "cannot be served by streamrec"),
    "no-weights": (_no_weights, "lacks model.pdiparams"),
    "no-contract": (_no_contract, "contract.json cannot be served from (FileNotFoundError"),
    "bad-model": (_bad_model, "contract.json cannot be served from (ValidationError"),
    "short-rows": (_short_rows, "item.rows.npy: 40 keys but 20 rows"),
    "unsorted-keys": (_unsorted_keys, "the keys are not sorted and unique"),
    "rows-outside": (_rows_outside, "outside table 'item' (512 rows)"),
}


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_verify_and_list_say_what_serve_would_refuse(root: Path, damage: str) -> None:
    from streamrec.serving.scorer import ExportedModel

    edit, said = DAMAGE[damage]
    export = root / "exports" / "v000002"
    edit(export)
    reseal(export)
    with pytest.raises((InvalidSnapshot, NotServable), match=re.escape(said)):
        ExportedModel(export)  # serve refuses it at load (before: short-rows and unsorted-keys loaded)
    lines = run(root, "verify", code=1).stdout.splitlines()
    assert lines[0] == "v000001  ok; export ok", lines
    assert lines[1].startswith("v000002  ok; export ") and said in lines[1], lines
    assert lines[2:] == ["1 valid, 1 invalid"]
    doc = orjson.loads(run(root, "verify", "2", "--json", code=1).stdout)
    assert doc["valid"] is False and doc["versions"][0]["export"]["valid"] is False
    assert said in doc["versions"][0]["export"]["problem"]
    assert doc["versions"][0]["export"]["own"] is (damage == "own-contract")
    listed = orjson.loads(run(root, "list", "--json").stdout)["versions"]
    assert [v["export"]["valid"] for v in listed] == [True, False]
    table = run(root, "list").stdout
    assert ("not servable" if damage == "own-contract" else "damaged") in table
    promoted = run(root, "promote", "2", code=1).output
    assert len(promoted.strip().splitlines()) == 1 and said in promoted
    assert SnapshotStore(root).current() is None


def test_a_learners_own_export_verifies_for_a_server_of_ones_own(root: Path) -> None:
    export = root / "exports" / "v000002"
    _own(export)
    reseal(export)
    run(root, "verify", "2", code=1)
    assert run(root, "verify", "--own-server").stdout.splitlines()[-1] == "2 valid, 0 invalid"
    run(root, "promote", "2", "--own-server")


def test_export_rebuild_mends_an_export_serve_would_not_load(root: Path) -> None:
    """`snapshot export --rebuild`, which the messages name, kept an export whose checksums held."""
    export = root / "exports" / "v000002"
    _short_rows(export)
    reseal(export)
    said = " ".join(run(root, "export", "2", code=1).output.split())
    assert "40 keys but 20 rows" in said
    assert said.count("`streamrec snapshot export 2 --rebuild`") == 1, said  # named once, by refusal
    promoted = " ".join(run(root, "promote", "2", code=1).output.split())
    assert promoted.count("`streamrec snapshot export 2 --rebuild`") == 1, promoted
    run(root, "export", "2", "--rebuild")
    assert run(root, "verify", "2").stdout.splitlines()[-1] == "1 valid, 0 invalid"
    run(root, "promote", "2")


def test_rollback_skips_an_export_serve_would_not_load(root: Path) -> None:
    """`snapshot rollback` took a version whose export serve then refused (checksums only)."""
    run(root, "promote", "1")
    run(root, "promote", "2")
    _unsorted_keys(root / "exports" / "v000001")
    reseal(root / "exports" / "v000001")
    said = run(root, "rollback", code=1).output
    assert "no earlier promoted valid version to roll back to from v000002 (invalid: v000001)" in said
    assert SnapshotStore(root).current() == 2


def _infinite_state(version: Path) -> str:
    """Set a weight of ``version``'s state to inf and reseal it; what the refusals say."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(version / "model.safetensors"))
    name = next(k for k, v in tensors.items() if v.dtype == np.float32)
    tensors[name] = tensors[name].copy()
    tensors[name].flat[0] = np.inf
    save_file(tensors, str(version / "model.safetensors"))
    reseal(version)
    return f"its state holds NaN or infinite values in model/{name}"


def test_verify_list_show_and_promote_refuse_state_that_is_not_finite(root: Path) -> None:
    """A snapshot's state edited to hold NaN and resealed: `verify`, `list` and `show` said ok
    (exit 0), and `promote` served it while its export, written before the edit, was there;
    a learner resuming it and its export refuse it (`non_finite`).
    """
    said = _infinite_state(root / "v000002")
    lines = run(root, "verify", code=1).stdout.splitlines()
    assert lines[0] == "v000001  ok; export ok" and lines[-1] == "1 valid, 1 invalid", lines
    assert lines[1].startswith(f"v000002  invalid: {said}") and lines[1].endswith("; export ok"), lines
    doc = orjson.loads(run(root, "verify", "2", "--json", code=1).stdout)
    assert doc["valid"] is False and doc["versions"][0]["problem"].startswith(said)
    listed = orjson.loads(run(root, "list", "--json").stdout)["versions"]
    assert [v["valid"] for v in listed] == [True, False] and listed[1]["problem"].startswith(said)
    assert orjson.loads(run(root, "show", "2", "--json", code=1).stdout)["problem"].startswith(said)
    assert f"invalid: {said}" in run(root, "show", "2", code=1).stdout
    run(root, "show", "1")
    refused = run(root, "promote", "2", code=1).output.strip()
    assert refused.startswith(f"error: v000002 is not served: {said}") and len(refused.splitlines()) == 1
    assert SnapshotStore(root).current() is None


@pytest.mark.parametrize("command", ["rollback", "canary", "ab"])
def test_rollback_canary_and_ab_refuse_state_that_is_not_finite(root: Path, command: str) -> None:
    """`promote` refused a version whose state holds NaN or infinity (2c32ac2), in the command
    alone: `rollback` went back to such a version, and a canary or an A/B test sent users to
    it, wherever its export, written before the edit, was there (noted at the last stop).
    """
    run(root, "promote", "1")
    run(root, "promote", "2")
    from streamrec.snapshots.traffic import read_plan

    bad = 1 if command == "rollback" else 2
    if command != "rollback":
        run(root, "rollback")  # v000001 served, v000002 the candidate
    said = _infinite_state(root / f"v{bad:06d}")
    args = {"rollback": [], "canary": ["2", "--share", "5%"], "ab": ["a=current:50%", "b=v000002:50%"]}
    refused = run(root, command, *args[command], code=1).output
    assert ("(invalid: v000001)" if command == "rollback" else said) in refused, refused
    assert SnapshotStore(root).current() == (2 if command == "rollback" else 1)
    assert read_plan(root) is None


def _nan_weights(root: Path, version: int) -> None:
    """Write ``version``'s export again from its learner with one weight matrix NaN."""
    from streamrec.serving.export import learner_from_snapshot, write_export

    kind, learner = learner_from_snapshot(SnapshotStore(root), version)
    arrays = learner.state_arrays()
    name = next(k for k, v in arrays.items() if k.startswith("model/") and "mlp" in k and v.ndim == 2)
    arrays[name] = np.full_like(arrays[name], np.nan)
    learner.load_state_arrays(arrays)
    shutil.rmtree(root / "exports" / f"v{version:06d}")
    write_export(learner, root / "exports" / f"v{version:06d}", version, kind)


def _cut_weights(root: Path, version: int) -> None:
    path = root / "exports" / f"v{version:06d}" / "model.pdiparams"
    path.write_bytes(path.read_bytes()[:1000])
    reseal(path.parent)


def _garbage_onnx(root: Path, version: int) -> None:
    path = root / "exports" / f"v{version:06d}" / "model.onnx"
    if not path.is_file():
        pytest.skip("exports hold no ONNX graph here (the onnx extra is not installed)")
    path.write_bytes(b"not a graph")
    reseal(path.parent)


GRAPHS = {
    "nan-weights": (_nan_weights, "its paddle graph scores a probe batch as NaN or infinity"),
    "cut-weights": (_cut_weights, "Paddle Inference cannot load"),
    "garbage-onnx": (_garbage_onnx, "onnxruntime cannot load"),
}


@pytest.mark.parametrize("damage", GRAPHS, ids=list(GRAPHS))
def test_verify_runs_each_graph_as_serve_would(root: Path, damage: str) -> None:
    """A graph whose weights are NaN loaded and answered NaN to every request; one cut short
    stopped ``engine=paddle`` (``auto`` ran the ONNX graph); an ONNX graph that does not load
    was fallen back from at INFO: `verify` said ok to each, and `export --rebuild` kept them.
    """
    from streamrec.serving.scorer import ExportedModel

    edit, said = GRAPHS[damage]
    edit(root, 2)
    if damage == "nan-weights":  # serve refuses it at load (before: it answered NaN)
        with pytest.raises(InvalidSnapshot, match=said):
            ExportedModel(root / "exports" / "v000002")
    lines = run(root, "verify", code=1).stdout.splitlines()
    assert lines[0] == "v000001  ok; export ok" and lines[-1] == "1 valid, 1 invalid", lines
    assert lines[1].startswith("v000002  ok; export invalid: ") and said in lines[1], lines
    assert said in run(root, "export", "2", code=1).output
    run(root, "export", "2", "--rebuild")
    assert run(root, "verify").stdout.splitlines()[-1] == "2 valid, 0 invalid"


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_show_exits_1_for_an_invalid_version_as_verify_does(root: Path, as_json: bool) -> None:
    """`snapshot show` of a version whose tensor file fails its checksum printed "invalid" with
    exit status 0, while one whose manifest fails exited 1 and `verify` exits 1 for both (found by
    the snapshot tools tour, checking exit codes across the subcommands).
    """
    path = root / "v000002" / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    shown = run(root, "show", "2", *(["--json"] if as_json else []), code=1).stdout
    said = f"{path} does not match its checksum"
    assert said in (orjson.loads(shown)["problem"] if as_json else shown.replace("\n", ""))
    run(root, "show", "1", *(["--json"] if as_json else []))


@pytest.mark.parametrize("command", ["list", "verify", "export", "promote", "rollback"])
def test_an_exports_files_are_hashed_once_a_check(
    root: Path, command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From two stops' reviews: an export's checksums were verified four times a promotion
    (promotion's own check, then serve's check ran `check_export` and `check_loads`, which ran
    both), twice for each entry of `list` and `verify`, and twice by `export`; then, with
    `read_export` verifying first, still twice a promotion (promotion's checksums, then serve's
    read). Promotion now asks serve's read alone, which verifies as it reads.
    """
    if command == "rollback":
        run(root, "promote", "1")
        run(root, "promote", "2")
    import streamrec.snapshots.exports as exports

    hashed: list[Path] = []

    def counted(path: Path) -> str:
        hashed.append(Path(path))
        return real(path)

    real = exports.sha256_file
    monkeypatch.setattr(exports, "sha256_file", counted)
    run(root, command, *(["1"] if command not in ("list", "rollback") else []))
    of_export = [p for p in hashed if "exports" in p.parts]
    assert of_export and len(of_export) == len(set(of_export)), sorted(of_export)


# Found by the snapshot tools tour (helper A): `snapshot export V` of a version whose tensor
# file had a byte changed, its export whole, said "v000002 exported: PATH", exit 0, while
# `verify` and `promote` refused it; and a version written by a later release (a state layout
# newer than this one reads) was "ok" to `verify` and promoted, while a learner refused it.


def _flip_last_byte(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF  # tensor data, not the header: still a safetensors file
    path.write_bytes(bytes(raw))


def test_export_refuses_a_damaged_version_whose_export_is_whole(root: Path) -> None:
    damaged = root / "v000002" / "model.safetensors"
    _flip_last_byte(damaged)
    refused = run(root, "export", "2", code=1).output.strip()
    assert len(refused.splitlines()) == 1, refused
    assert refused.startswith("error: v000002 is not exported:"), refused
    assert f"{damaged} does not match its checksum" in refused, refused
    assert "v000002 exported" not in refused
    run(root, "export", "2", "--json", code=1)
    assert run(root, "export", "1").output.strip() == f"v000001 exported: {root / 'exports' / 'v000001'}"


def _later_layout(version: Path, layout: int) -> None:
    """Record ``layout`` in a version's manifest and reseal it, as a later release would write it."""
    manifest = orjson.loads((version / "manifest.json").read_bytes())
    manifest["config"]["state_layout"] = layout
    manifest["written_by_a_later_release"] = True  # a field this release does not know
    raw = orjson.dumps(manifest, option=orjson.OPT_INDENT_2)
    (version / "manifest.json").write_bytes(raw)
    (version / "manifest.sha256").write_text(f"{hashlib.sha256(raw).hexdigest()}  manifest.json\n")


def test_a_version_of_a_later_release_is_said_unreadable_by_verify_list_promote_and_export(
    root: Path,
) -> None:
    _later_layout(root / "v000002", STATE_LAYOUT + 1)
    said = f"state layout {STATE_LAYOUT + 1} is not one this version reads (1..{STATE_LAYOUT})"
    lines = run(root, "verify", code=1).stdout.splitlines()
    assert lines[0] == "v000001  ok; export ok", lines
    assert lines[1].startswith("v000002  invalid: ") and said in lines[1], lines
    listed = orjson.loads(run(root, "list", "--json").stdout)["versions"]
    assert [v["valid"] for v in listed] == [True, False] and said in listed[1]["problem"]
    refused = run(root, "promote", "2", code=1).output.strip()
    assert refused.startswith("error: v000002 is not served: ") and said in refused, refused
    assert SnapshotStore(root).current() is None
    refused = run(root, "export", "2", code=1).output.strip()
    assert refused.startswith("error: v000002 is not exported: ") and said in refused, refused
    run(root, "promote", "1")


def test_export_builds_from_a_version_hashed_and_read_once(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the last stop's review: `snapshot export V` checked the version (its checksums, then
    its tensors for NaN and a later layout) and then built its export from it, which verified
    and read it again. Building loads the version through the same checks, so they run once.
    """
    import streamrec.snapshots.files as files
    import streamrec.snapshots.store as store_module

    shutil.rmtree(root / "exports" / "v000002")
    hashed: list[Path] = []
    read: list[Path] = []
    real_hash, real_read = files.sha256_file, files.read_tensor_files

    def counted_hash(path: Path) -> str:
        hashed.append(Path(path))
        return real_hash(path)

    def counted_read(directory: Path, manifest: Any) -> Any:
        read.append(Path(directory))
        return real_read(directory, manifest)

    monkeypatch.setattr(files, "sha256_file", counted_hash)
    monkeypatch.setattr(store_module, "read_tensor_files", counted_read)
    run(root, "export", "2")
    assert hashed and len(hashed) == len(set(hashed)), sorted(hashed)
    assert read and len(read) == len(set(read)), sorted(read)
    assert (root / "exports" / "v000002" / "manifest.json").is_file()
