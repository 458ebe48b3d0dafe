"""`streamrec snapshot list|show|verify|diff|promote|rollback|prune`, text and --json."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner, Result

from streamrec.cli import app
from streamrec.snapshots.store import SnapshotStore
from tests.unit.snapshots.test_promotion import corrupt
from tests.unit.snapshots.test_snapshot import write


def run(root: Path, *args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(app, ["snapshot", *args, "--snapshot-dir", str(root)])
    assert result.exit_code == code, result.output
    return result


def run_json(root: Path, *args: str, code: int = 0) -> Any:
    return orjson.loads(run(root, *args, "--json", code=code).stdout)


@pytest.fixture
def store(tmp_path: Path) -> SnapshotStore:
    store = SnapshotStore(tmp_path)
    for value in (1.0, 2.0, 3.0):
        write(store, value, metrics={"auc": 0.6 + value / 100})
    return store


def test_list_marks_the_served_and_promoted_versions(store: SnapshotStore) -> None:
    run(store.root, "promote", "1")
    run(store.root, "promote", "v000002")
    rows = {
        cells[0]: cells[1]
        for line in run(store.root, "list").stdout.splitlines()
        if (cells := [c.strip() for c in line.strip("│ ").split("│")])[0].startswith("v0")
    }
    assert rows == {"v000001": "promoted", "v000002": "CURRENT", "v000003": ""}
    doc = run_json(store.root, "list")
    assert doc["current"] == 2
    assert [(v["name"], v["valid"], v["current"], v["promoted"]) for v in doc["versions"]] == [
        ("v000001", True, False, True), ("v000002", True, True, True), ("v000003", True, False, False),
    ]
    assert doc["versions"][0]["manifest"]["metrics"] == {"auc": 0.61}


def test_show_accepts_every_way_of_naming_a_version(store: SnapshotStore) -> None:
    run(store.root, "promote", "2")
    for spec, version in (("v000001", 1), ("3", 3), ("current", 2), ("latest", 3)):
        doc = run_json(store.root, "show", spec)
        assert (doc["version"], doc["valid"], doc["current"]) == (version, True, version == 2)
    text = run(store.root, "show", "current").stdout
    assert "v000002 CURRENT" in text and "metrics.auc" in text and "files.model.safetensors" in text
    assert "t[0]:7" in text
    out = run(store.root, "show", "nine", code=1)
    assert "'nine' is not a version" in out.stderr and out.stdout == ""


def test_verify_exits_1_naming_the_bad_file(store: SnapshotStore) -> None:
    assert "3 valid, 0 invalid" in run(store.root, "verify").stdout
    assert run_json(store.root, "verify", "2")["valid"] is True
    bad = corrupt(store, 2)
    text = run(store.root, "verify", code=1).stdout
    assert "v000001  ok" in text and f"{bad} does not match its checksum" in text
    doc = run_json(store.root, "verify", code=1)
    assert doc["valid"] is False and [v["valid"] for v in doc["versions"]] == [True, False, True]
    assert run_json(store.root, "verify", "1")["valid"] is True


def test_diff_shows_changed_tensors(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    emb = np.zeros((10, 4), np.float32)
    write(store, metrics={"auc": 0.6})
    store.write({"model": {"emb": emb}}, micro_batches=1, samples_trained=1, positions=())
    emb[[2, 5]] = 0.25
    store.write(
        {"model": {"emb": emb}}, micro_batches=2, samples_trained=2, positions=(), metrics={"auc": 0.7}
    )
    doc = run_json(tmp_path, "diff", "2", "latest")
    assert [(t["name"], t["status"], t["changed_rows"], t["max_abs_diff"]) for t in doc["tensors"]] == [
        ("emb", "changed", 2, 0.25),
    ]
    assert doc["metrics"] == [{"key": "auc", "a": None, "b": 0.7}]
    text = run(tmp_path, "diff", "2", "3").stdout
    assert "v000002 -> v000003" in text and "2/10" in text and "1 tensors differ, 0 the same" in text
    assert "auc: - -> 0.7000" in text


def test_promote_rollback_and_their_refusals(store: SnapshotStore) -> None:
    promoted = run_json(store.root, "promote", "1")
    assert promoted == {"current": 1, "name": "v000001", "previous": None, "ended": None, "changed": True}
    assert "serving v000003 (was v000001)" in run(store.root, "promote", "latest", "--reason", "ab").stdout
    assert store.history()[-1].reason == "ab"
    assert run_json(store.root, "rollback") == {"current": 1, "name": "v000001", "previous": 3, "ended": None}
    out = run(store.root, "rollback", code=1)
    assert "no earlier promoted valid version to roll back to from v000001" in out.stderr
    bad = corrupt(store, 2)
    out = run(store.root, "promote", "2", "--json", code=1)
    assert f"{bad} does not match its checksum" in out.stderr and out.stdout == ""
    assert store.current() == 1


def test_prune_keeps_the_configured_number(store: SnapshotStore, monkeypatch: pytest.MonkeyPatch) -> None:
    for _ in range(3):
        write(store)
    store.promote(1)
    monkeypatch.setenv("STREAMREC_LEARNER__KEEP_SNAPSHOTS", "3")
    pruned = run_json(store.root, "prune")
    assert pruned == {"keep": 3, "deleted": [2, 3], "exports_deleted": [], "kept": [1, 4, 5, 6]}
    assert "deleted v000004; 3 kept" in run(store.root, "prune", "--keep", "2").stdout
    assert "nothing to delete (keeping all)" in run(store.root, "prune", "--keep", "0").stdout
    # refused by the settings, as every flag that sets one is: one line naming it, status 1
    refused = run(store.root, "prune", "--keep", "-1", code=1).output
    assert "STREAMREC_LEARNER__KEEP_SNAPSHOTS (from its flag)" in refused  # the variable says 3
    assert "greater than or equal to 0" in refused


def test_create_with_nothing_trained_answers_with_the_newest_version(store: SnapshotStore) -> None:
    def learner() -> None:  # as a running learner with nothing trained since v000003 answers
        while not store.requests.pending():
            time.sleep(0.01)
        request = store.requests.pending()[0]
        store.requests.answer(request, 3)
        store.requests.done(request)

    thread = threading.Thread(target=learner)
    thread.start()
    result = run(store.root, "create", "--timeout", "20")
    thread.join(10)
    assert "nothing trained since v000003: no new snapshot" in result.output
    assert store.versions() == [1, 2, 3]


def _fake_export(root: Path, version: int, *, damaged: bool = False) -> None:
    """An export directory as `verify_export` reads it: files, their digests, the digest's digest."""
    import hashlib

    from streamrec.snapshots.exports import export_dir

    path = export_dir(root, version)
    path.mkdir(parents=True)
    (path / "model.pdiparams").write_bytes(b"weights")
    manifest = orjson.dumps({"files": {"model.pdiparams": hashlib.sha256(b"weights").hexdigest()}})
    (path / "manifest.json").write_bytes(manifest)
    (path / "manifest.sha256").write_text(hashlib.sha256(manifest).hexdigest() + "\n")
    if damaged:
        (path / "model.pdiparams").write_bytes(b"weightz")


def test_list_shows_each_versions_export(store: SnapshotStore) -> None:
    _fake_export(store.root, 1)
    _fake_export(store.root, 2, damaged=True)
    rows = {
        cells[0]: cells[-1]
        for line in run(store.root, "list").stdout.splitlines()
        if (cells := [c.strip() for c in line.strip("│ ").split("│")])[0].startswith("v0")
    }
    # v000001's checksums hold, but it has no contract.json: serve would not load it
    # (tests/unit/snapshots/test_verify_loads.py lists a whole one as "ok").
    assert rows == {"v000001": "damaged", "v000002": "damaged", "v000003": "missing"}
    doc = run_json(store.root, "list")
    assert [(v["export"]["present"], v["export"]["valid"]) for v in doc["versions"]] == [
        (True, False), (True, False), (False, False),
    ]
    assert "contract.json cannot be served from" in doc["versions"][0]["export"]["problem"]
    assert "model.pdiparams does not match its checksum" in doc["versions"][1]["export"]["problem"]
