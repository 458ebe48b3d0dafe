"""A served version's export damaged, truncated or never written: verify says so, promote and
rollback refuse it (or build a missing one first), a server starting on it falls back to the
first version that loads in rollback order, and a repeated load failure is logged once and counted.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import psutil  # type: ignore[import-untyped]
import pytest
from typer.testing import CliRunner, Result

from streamrec.cli import app
from streamrec.errors import InvalidSnapshot, SnapshotError
from streamrec.serving import export
from streamrec.serving.export import export_dir
from streamrec.serving.scorer import ExportedModel, Scorer
from streamrec.snapshots.store import SnapshotStore
from tests.support import trained_snapshots, wait_for

PARAMS = "model.pdiparams"


def damage(root: Path, version: int, how: str, name: str = PARAMS) -> Path:
    """Change one byte of an export's file, or cut it in half; returns the file."""
    path = export_dir(root, version) / name
    data = bytearray(path.read_bytes())
    if how == "byte":
        data[len(data) // 2] ^= 0xFF
    else:
        del data[len(data) // 2 :]
    path.write_bytes(bytes(data))
    return path


def snapshot(root: Path, *args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(app, ["snapshot", *args, "--snapshot-dir", str(root)])
    assert result.exit_code == code, result.output
    return result


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three trained, exported versions, made once for the module."""
    root = tmp_path_factory.mktemp("pristine")
    trained_snapshots(root, count=3)
    return root


@pytest.fixture
def store(pristine: Path, tmp_path: Path) -> SnapshotStore:
    root = tmp_path / "snapshots"
    shutil.copytree(pristine, root)
    return SnapshotStore(root)


@pytest.mark.parametrize("how", ["byte", "truncated"])
def test_verify_covers_the_export(store: SnapshotStore, how: str) -> None:
    damaged = damage(store.root, 2, how)
    result = snapshot(store.root, "verify", "2", code=1)
    assert f"{damaged} does not match its checksum" in result.output.replace("\n", "")
    doc = orjson.loads(snapshot(store.root, "verify", "--json", code=1).stdout)
    exports = {v["version"]: v["export"] for v in doc["versions"]}
    assert [v["valid"] for v in doc["versions"]] == [True, False, True]
    assert exports[2]["present"] and not exports[2]["valid"] and str(damaged) in exports[2]["problem"]
    assert exports[1] == {"path": str(export_dir(store.root, 1)), "present": True, "valid": True,
                          "problem": None, "own": False}


def test_verify_says_when_a_version_has_no_export(store: SnapshotStore) -> None:
    shutil.rmtree(export_dir(store.root, 3))
    result = snapshot(store.root, "verify", "3")
    assert "export missing" in result.output
    doc = orjson.loads(snapshot(store.root, "verify", "3", "--json").stdout)
    assert doc["versions"][0]["export"]["present"] is False and doc["valid"]


@pytest.mark.parametrize("how", ["byte", "truncated"])
def test_promote_refuses_a_damaged_export_naming_the_file(store: SnapshotStore, how: str) -> None:
    store.promote(1)
    damaged = damage(store.root, 2, how)
    with pytest.raises(InvalidSnapshot, match=f"{damaged} does not match its checksum.*--rebuild"):
        store.promote(2)
    result = snapshot(store.root, "promote", "2", code=1)
    assert "does not match its checksum" in result.output and "--rebuild" in result.output
    assert store.current() == 1 and store.promoted() == [1]
    snapshot(store.root, "export", "2", code=1)  # refused: it says --rebuild
    snapshot(store.root, "export", "2", "--rebuild")
    snapshot(store.root, "promote", "2")
    assert store.current() == 2


def test_rollback_skips_a_version_whose_export_is_damaged(store: SnapshotStore) -> None:
    for version in (1, 2, 3):
        store.promote(version)
    damage(store.root, 2, "byte")
    result = snapshot(store.root, "rollback")
    assert "serving v000001" in result.output
    assert store.current() == 1
    store.promote(3)
    damage(store.root, 1, "truncated")
    with pytest.raises(SnapshotError, match="no earlier promoted valid version"):
        store.rollback()
    assert store.current() == 3


def test_promote_builds_the_export_a_kill_mid_export_left_missing(store: SnapshotStore) -> None:
    shutil.rmtree(export_dir(store.root, 3))
    killed = subprocess.run(  # dies as kill -9 would, its export written but not yet renamed
        [sys.executable, "-m", "streamrec", "snapshot", "export", "3", "--snapshot-dir", str(store.root)],
        env={**os.environ, "STREAMREC_FAULT": "export.before_rename", "STREAMREC_FAULT_MODE": "exit"},
        capture_output=True, timeout=120,
    )
    assert killed.returncode == 137, killed.stderr.decode()[-2000:]
    assert not export_dir(store.root, 3).exists() and list((store.root / "exports").glob(".tmp-*"))
    assert "export missing" in snapshot(store.root, "verify", "3").output
    result = snapshot(store.root, "promote", "3")
    assert "v000003 had no export: built" in result.output
    assert store.current() == 3 and (export_dir(store.root, 3) / PARAMS).is_file()
    assert "export ok" in snapshot(store.root, "verify", "3").output


def _exporting(root: Path, out: Path, fault: str | None = None) -> subprocess.Popen[bytes]:
    """``snapshot export 2 --rebuild`` as a process of its own, frozen (SIGSTOP) at ``fault``."""
    faults = {"STREAMREC_FAULT": fault, "STREAMREC_FAULT_MODE": "stop"} if fault else {}
    with out.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "streamrec", "snapshot", "export", "2", "--rebuild",
             "--snapshot-dir", str(root)],
            env={**os.environ, **faults}, stdout=log, stderr=subprocess.STDOUT,
        )


def _stopped(proc: subprocess.Popen[bytes]) -> bool:
    return psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED


def test_two_rebuilds_of_one_export_at_once_both_succeed_one_building_it(
    store: SnapshotStore, tmp_path: Path
) -> None:
    """Found by a tour: the second of two `snapshot export 2 --rebuild` to reach the damaged export
    failed with "cannot delete the damaged export ...: No such file or directory" (the first had
    deleted it and was writing), or deleted the one the first had just written. Now they take
    turns: the one that waits finds the export whole and says it was built meanwhile.
    """
    damage(store.root, 2, "byte")
    first = _exporting(store.root, tmp_path / "first.log", "export.before_delete")
    second = None
    try:
        wait_for(lambda: _stopped(first), what="the first export at the damaged one, before deleting it")
        second = _exporting(store.root, tmp_path / "second.log", "export.before_rename")
        waiting = "waiting for another export of v000002"
        wait_for(lambda: _stopped(second) or waiting in (tmp_path / "second.log").read_text(),
                 what="the second export waiting, or at its rename")
        os.kill(first.pid, signal.SIGCONT)
        assert first.wait(120) == 0, (tmp_path / "first.log").read_text()
        os.kill(second.pid, signal.SIGCONT)  # stopped at its rename before; waiting now
        assert second.wait(120) == 0, (tmp_path / "second.log").read_text()
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    said = (tmp_path / "second.log").read_text()
    assert "v000002 exported" in said and "built by another export meanwhile" in said, said
    assert "export ok" in snapshot(store.root, "verify", "2").output
    assert not list((store.root / "exports").glob(".tmp-*"))


def test_a_prune_keeps_the_export_another_process_is_writing(store: SnapshotStore, tmp_path: Path) -> None:
    """Found in a tour's reading: `prune_exports`, which the learner's gate runs after each
    snapshot, deleted every ``.tmp-*`` under ``exports/``, an operator's ``export --rebuild`` in
    progress among them, which then failed. A temporary names its writer's pid now, and only
    those of writers gone (or of the pruning process itself) are removed.
    """
    damage(store.root, 2, "byte")
    proc = _exporting(store.root, tmp_path / "export.log", "export.before_rename")
    try:
        wait_for(lambda: _stopped(proc), what="the export written, before its rename")
        export.prune_exports(store)
        assert list((store.root / "exports").glob(".tmp-*")), "the export in progress was deleted"
        os.kill(proc.pid, signal.SIGCONT)
        assert proc.wait(120) == 0, (tmp_path / "export.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "export ok" in snapshot(store.root, "verify", "2").output


def test_a_rebuild_that_waited_too_long_says_which_export_was_in_progress(
    store: SnapshotStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    damage(store.root, 2, "byte")
    monkeypatch.setattr(export, "REBUILD_WAIT_S", 0.3)
    with export._rebuilding(export_dir(store.root, 2).parent, 2):  # another rebuild, held
        in_progress = rf"another export of v000002 \(pid {os.getpid()}\) was in progress"
        with pytest.raises(SnapshotError, match=in_progress):
            export.export_snapshot(store, 2, rebuild=True)
    assert export.export_snapshot(store, 2, rebuild=True) == export_dir(store.root, 2)
    assert "export ok" in snapshot(store.root, "verify", "2").output


def test_a_server_starting_on_a_damaged_current_serves_the_version_a_rollback_would_take(
    store: SnapshotStore, caplog: pytest.LogCaptureFixture
) -> None:
    store.promote(1)
    store.promote(2)
    store.promote(3)
    damage(store.root, 3, "truncated")
    with caplog.at_level(logging.WARNING, logger="streamrec.serving.scorer"):
        scorer = Scorer(store.root)
    assert scorer.version == 2 and scorer.current == 3 and not scorer.serves_current
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any("cannot serve v000003, serving version=v000002" in r.getMessage() for r in warnings)
    assert scorer.load_failures == 1


def test_a_server_falls_back_along_the_rollback_order_never_to_a_version_rolled_back_from(
    store: SnapshotStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Promote 3, roll back ("3 is bad") to 2, then 2's export damaged: a fresh server served
    3, the newest promoted version, the one just rejected. It takes the one a rollback would.
    """
    for version in (1, 2, 3):
        store.promote(version)
    store.rollback(reason="v3 is bad")
    damage(store.root, 2, "truncated")
    with caplog.at_level(logging.WARNING, logger="streamrec.serving.scorer"):
        scorer = Scorer(store.root)
    assert scorer.version == 1 and scorer.current == 2
    assert "cannot serve v000002, serving version=v000001" in caplog.text
    store.serving.current_path.write_text("garbage\n")  # unreadable: 2 (damaged), then 1, never 3
    assert Scorer(store.root).version == 1


def test_a_long_history_of_two_versions_is_tried_once_a_version(
    store: SnapshotStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by the serving-lifetime tour: after 800 promotions alternating two versions (a gate
    promoting every snapshot does the like), a server process started with both exports damaged
    verified v000002 once for each time it had been promoted, 3,500 WARNING lines in 64 s, before
    it fell back; `snapshot rollback` named it once for each too. Each version is tried once.
    """
    store.promote(1)
    for _ in range(30):
        store.promote(2)
        store.promote(3)
    assert store.serving.rollback_candidates(3) == [2, 1]
    damage(store.root, 3, "byte")
    damage(store.root, 2, "byte")
    with caplog.at_level(logging.WARNING):
        assert Scorer(store.root).version == 1
        assert store.rollback() == 1
    said = [r.getMessage() for r in caplog.records if "v000002" in r.getMessage()]
    assert len(said) == 2, said  # the server's, then the rollback's


def test_a_server_starting_on_an_unreadable_current_falls_back_too(store: SnapshotStore) -> None:
    store.promote(1)
    store.promote(2)
    store.serving.current_path.write_text("garbage\n")
    scorer = Scorer(store.root)
    assert scorer.version == 2 and scorer.current is None and not scorer.serves_current


def test_a_server_with_no_promoted_version_that_loads_still_fails(store: SnapshotStore) -> None:
    store.promote(1)
    damage(store.root, 1, "byte")
    with pytest.raises(InvalidSnapshot, match="does not match its checksum"):
        Scorer(store.root)


def test_a_repeated_load_failure_is_logged_once_and_counted(
    store: SnapshotStore, caplog: pytest.LogCaptureFixture
) -> None:
    store.promote(1)
    scorer = Scorer(store.root)
    store.promote(2)
    damaged = damage(store.root, 2, "byte")  # after its promotion: a disk fault, say
    with caplog.at_level(logging.INFO, logger="streamrec.serving.scorer"):
        for _ in range(5):
            assert not scorer.refresh()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and str(damaged) in errors[0] and "logged once" in errors[0]
    assert scorer.load_failures == 5
    assert scorer.version == 1 and scorer.current == 2 and not scorer.serves_current
    snapshot(store.root, "export", "2", "--rebuild")
    assert scorer.refresh() and scorer.version == 2 and scorer.serves_current


# --- a contract edited and its export resealed: every checksum holds, the content does not ---


def edit_contract(root: Path, version: int, edit: Callable[[dict[str, Any]], object]) -> Path:
    """Change an export's contract.json, then reseal its manifest as an operator 'fixing' it would."""
    path = export_dir(root, version)
    contract = orjson.loads((path / "contract.json").read_bytes())
    edit(contract)
    (path / "contract.json").write_bytes(orjson.dumps(contract))
    manifest = orjson.loads((path / "manifest.json").read_bytes())
    manifest["files"] = {n: hashlib.sha256((path / n).read_bytes()).hexdigest() for n in manifest["files"]}
    raw = orjson.dumps(manifest)
    (path / "manifest.json").write_bytes(raw)
    (path / "manifest.sha256").write_text(f"{hashlib.sha256(raw).hexdigest()}  manifest.json\n")
    return path / "contract.json"


def _rename_keys(c: dict[str, Any]) -> None:
    c["tables"][0]["keys"] = "ids/gone.keys.npy"


EDITS: dict[str, Callable[[dict[str, Any]], object]] = {
    "a keys file that is not there": _rename_keys,
    "sequence_length fifty": lambda c: c.update(sequence_length="fifty"),
    "no tables": lambda c: c.pop("tables"),
    # verify said ok, promote took it, and each /score failed with KeyError: 'dtype'
    "an input with no dtype": lambda c: c["inputs"][0].pop("dtype"),
    "an input of dtype int999": lambda c: c["inputs"][1].update(dtype="int999"),
}


@pytest.mark.parametrize("edit", EDITS.values(), ids=EDITS.keys())
def test_a_resealed_contract_that_does_not_load_fails_verify_and_promote_and_is_fallen_back_from(
    store: SnapshotStore, edit: Callable[[dict[str, Any]], object], caplog: pytest.LogCaptureFixture
) -> None:
    """An edited contract.json with its manifest resealed (or an export another release wrote):
    verify said ok, promote took it, a fresh server exited 1 with a traceback and a running
    one logged a traceback at every poll, uncounted. It is a damaged export like any other.
    """
    store.promote(1)
    contract = edit_contract(store.root, 2, edit)
    with pytest.raises(InvalidSnapshot, match="contract.json"):
        ExportedModel(export_dir(store.root, 2))
    scorer = Scorer(store.root)
    store.serving.point(2)  # as a promotion from before this check did
    with caplog.at_level(logging.INFO, logger="streamrec.serving.scorer"):
        for _ in range(3):
            assert not scorer.refresh()
    assert scorer.load_failures == 3 and scorer.version == 1
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "contract.json" in errors[0].getMessage() and not errors[0].exc_info
    assert Scorer(store.root).version == 1  # a fresh server falls back
    store.serving.point(1)
    assert str(contract) in snapshot(store.root, "verify", "2", code=1).output.replace("\n", "")
    assert "contract.json" in snapshot(store.root, "promote", "2", code=1).output
    assert store.current() == 1


@pytest.mark.parametrize("edit", [
    lambda c: c["tables"][1].update(rows="many"),
    lambda c: c["model"].update(mlp_units="wide"),  # a setting this release knows, mistyped
    lambda c: c["tables"][0].update(key_rows=None),
])
def test_any_content_error_of_a_contract_is_one_invalid_snapshot_naming_it(
    store: SnapshotStore, edit: Callable[[dict[str, Any]], object]
) -> None:
    edit_contract(store.root, 2, edit)
    with pytest.raises(SnapshotError, match="contract.json"):
        ExportedModel(export_dir(store.root, 2))


def test_a_paddle_graph_cut_short_and_resealed_is_fallen_back_from(store: SnapshotStore) -> None:
    """Found by the snapshot tools tour: ``model.pdiparams`` cut in half and the export's manifest
    resealed; with ``engine=paddle``, ``streamrec score`` and ``serve`` stopped on Paddle's
    RuntimeError traceback ("Cannot read tensor desc size") rather than falling back to the
    version before, as they do from any other damaged export.
    """
    from tests.unit.snapshots.test_verify_loads import reseal

    store.promote(1)
    store.promote(2)
    damage(store.root, 2, "truncated")
    reseal(export_dir(store.root, 2))
    with pytest.raises(InvalidSnapshot, match=r"^Paddle Inference cannot load .*v000002/model.json") as info:
        ExportedModel(export_dir(store.root, 2), engine="paddle")
    assert "\n" not in str(info.value)
    scorer = Scorer(store.root, engine="paddle")
    assert (scorer.version, scorer.current, scorer.serves_current) == (1, 2, False)


def _reseal_version(root: Path, version: int, edit: Callable[[dict[str, Any]], object]) -> None:
    """Change a version's manifest.json and reseal it, as a later release would have written it."""
    path = root / f"v{version:06d}"
    manifest = orjson.loads((path / "manifest.json").read_bytes())
    edit(manifest)
    raw = orjson.dumps(manifest)
    (path / "manifest.json").write_bytes(raw)
    (path / "manifest.sha256").write_text(f"{hashlib.sha256(raw).hexdigest()}  manifest.json\n")


def _a_later_setting(doc: dict[str, Any]) -> None:
    doc["later_release_field"] = 1
    doc["model"]["later_setting"] = 3  # a model setting added after this release, at its default


def test_a_later_releases_model_setting_does_not_make_its_export_unservable(store: SnapshotStore) -> None:
    """Found by the upgrades tour: upgrades.md promises that a release rolled back to serves and
    scores the later release's exports, but a contract whose model section held a setting this
    release does not know (as every release that added one wrote: match_features, match_init,
    a table's also) was 'damaged': verify failed, promote refused it, a server fell back; and
    `snapshot export --rebuild` of such a version stopped with pydantic's traceback. The setting
    is left out, as a manifest's unknown fields are; tensors that do not fit are still refused.
    """
    store.promote(1)
    edit_contract(store.root, 2, _a_later_setting)
    ExportedModel(export_dir(store.root, 2))
    assert "export ok" in snapshot(store.root, "verify", "2").output
    snapshot(store.root, "promote", "2")
    assert Scorer(store.root).version == 2
    _reseal_version(store.root, 3, lambda m: m["config"]["model"].update(later_setting=3))
    shutil.rmtree(export_dir(store.root, 3))
    output = snapshot(store.root, "export", "3").output
    assert "v000003 exported" in output
    assert "does not know, built without them: later_setting" in output  # said, not dropped silently
    assert "export ok" in snapshot(store.root, "verify", "3").output
