"""SnapshotStore: versioned atomic writes, checksums, requests; no pickle anywhere."""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from streamrec import faults
from streamrec.cli import app
from streamrec.errors import InvalidSnapshot, SnapshotDirError, SnapshotError, SnapshotWriteError
from streamrec.kafka.records import Position
from streamrec.snapshots import files as snapshot_files
from streamrec.snapshots.manifest import MANIFEST, MANIFEST_SUM, checksum_line
from streamrec.snapshots.store import SnapshotManifest, SnapshotStore


def write(store: SnapshotStore, value: float = 1.0, **fields: object) -> SnapshotManifest:
    tensors: dict[str, dict[str, np.ndarray]] = {
        "model": {"w": np.full(3, value, np.float32)}, "state": {"k": np.arange(4)}
    }
    args = {"micro_batches": 2, "samples_trained": 10, "positions": (Position("t", 0, 7),)} | fields
    return store.write(tensors, **args)


def test_versions_increase_and_round_trip(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    assert store.latest() is None and store.versions() == []
    first = write(store, 1.0, metrics={"auc": float("nan"), "gauc": 0.6})
    second = write(store, 2.0)
    assert (first.version, second.version) == (1, 2)
    assert store.latest() == second
    manifest, tensors = store.load(1)
    assert manifest == store.manifest(1)
    assert manifest.positions == (Position("t", 0, 7),)
    assert manifest.metrics == {"auc": None, "gauc": 0.6}  # NaN is stored as null
    np.testing.assert_array_equal(tensors["model"]["w"], np.ones(3, np.float32))
    assert sorted(p.name for p in store.path(1).iterdir()) == [
        "manifest.json", "manifest.sha256", "model.safetensors", "state.safetensors",
    ]


def test_tampered_or_missing_files_are_refused(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    write(store)
    weights = store.path(1) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x00")
    with pytest.raises(SnapshotError, match="checksum"):
        store.load(1)
    weights.unlink()
    with pytest.raises(SnapshotError, match="missing"):
        store.load(1)


def test_leftover_temporary_directories_are_not_snapshots(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    (tmp_path / ".tmp-crashed").mkdir()
    (tmp_path / "v000009-partial").mkdir()
    assert store.versions() == []
    assert write(store).version == 1


def test_requests_are_filed_answered_and_found(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    request = store.requests.request()
    assert store.requests.pending() == [request]
    write(store, request_id=request)
    store.requests.done(request)
    assert store.requests.pending() == []
    found = store.find_request(request)
    assert found is not None and found.version == 1
    assert store.find_request("other") is None


# --- manifest checksum, invalid versions, fallback (defect 10) ------------------------


def test_a_manifest_from_a_later_release_with_fields_this_one_lacks_is_read(tmp_path: Path) -> None:
    """Rolling the code back after an upgrade: the snapshots the later release wrote stay
    readable (before: a field this release did not know made every such version invalid, and the
    learner resumed from an older one, or started fresh).
    """
    store = SnapshotStore(tmp_path)
    write(store)
    path = store.path(1) / MANIFEST
    doc = orjson.loads(path.read_bytes()) | {"some_later_field": {"x": 1}}
    raw = orjson.dumps(doc, option=orjson.OPT_INDENT_2)
    path.write_bytes(raw)
    (store.path(1) / MANIFEST_SUM).write_bytes(checksum_line(raw))
    assert store.validate(1) is None
    manifest = store.manifest(1)
    assert manifest.positions == (Position("t", 0, 7),) and manifest.samples_trained == 10


def test_a_changed_manifest_is_refused_and_the_previous_version_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One digit of an offset changed in the newest manifest: that version is invalid."""
    store = SnapshotStore(tmp_path)
    write(store, 1.0)
    write(store, 2.0, positions=(Position("t", 0, 1234),))
    path = store.path(2) / "manifest.json"
    path.write_bytes(path.read_bytes().replace(b"1234", b"1235"))
    with pytest.raises(InvalidSnapshot, match="manifest.json does not match its checksum"):
        store.manifest(2)
    assert store.validate(2) is not None and store.validate(1) is None
    found = store.latest_valid()
    assert found is not None
    manifest, tensors = found
    assert manifest.version == 1
    np.testing.assert_array_equal(tensors["model"]["w"], np.ones(3, np.float32))
    assert "v000002" in caplog.text and "manifest.json does not match" in caplog.text


def test_a_corrupt_newest_tensor_file_falls_back_to_the_previous_version(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SnapshotStore(tmp_path)
    write(store, 1.0)
    write(store, 2.0)
    weights = store.path(2) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x01")
    found = store.latest_valid()
    assert found is not None and found[0].version == 1
    assert f"{weights} does not match its checksum" in caplog.text


def test_a_removed_manifest_checksum_makes_the_version_invalid(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    write(store)
    (store.path(1) / "manifest.sha256").unlink()
    reason = store.validate(1)
    assert reason is not None and "manifest.sha256 is missing" in reason
    assert store.latest_valid() is None


def test_empty_and_manifestless_versions_are_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SnapshotStore(tmp_path)
    write(store, 1.0)
    write(store, 2.0)
    (store.path(2) / "manifest.json").unlink()
    store.path(9).mkdir()  # a stray empty version directory
    found = store.latest_valid()
    assert found is not None and found[0].version == 1
    assert "v000009" in caplog.text and "v000002" in caplog.text
    assert [(e.version, e.problem is None) for e in store.entries()] == [
        (1, True), (2, False), (9, False),
    ]
    assert store.latest() == store.manifest(1)
    assert [m.version for m in store.manifests()] == [1]
    # The next version goes above the stray one rather than into it.
    assert write(store).version == 10


def test_no_valid_version_starts_fresh_with_a_warning_naming_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SnapshotStore(tmp_path)
    write(store)
    (store.path(1) / "state.safetensors").unlink()
    store.path(2).mkdir()
    assert store.latest_valid() is None
    assert "no valid snapshot" in caplog.text and "invalid=v000002,v000001" in caplog.text


def test_snapshot_list_shows_invalid_versions(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    write(store)
    write(store)
    (store.path(2) / "manifest.json").unlink()
    store.path(9).mkdir()
    out = CliRunner().invoke(app, ["snapshot", "list", "--snapshot-dir", str(tmp_path)])
    assert out.exit_code == 0, out.output
    rows = {
        cells[0]: (cells[-2], cells[-1])  # status, export
        for line in out.output.splitlines()
        if (cells := [c.strip() for c in line.strip("│ ").split("│")])[0].startswith("v0")
    }
    assert rows == {
        "v000001": ("ok", "missing"),
        "v000002": ("invalid: v000002/manifest.json is missing", "missing"),
        "v000009": ("invalid: v000009/manifest.json is missing", "missing"),
    }


# --- permissions ------------------------------------------------------------------------


def test_snapshot_files_are_world_readable(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    write(store)
    assert stat.S_IMODE(store.path(1).stat().st_mode) == 0o755
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in store.path(1).iterdir()}
    assert modes == dict.fromkeys(
        ["manifest.json", "manifest.sha256", "model.safetensors", "state.safetensors"], 0o644
    )


# --- write errors and leftovers (defect 9) ------------------------------------------------


def test_a_failing_write_leaves_nothing_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SnapshotStore(tmp_path)

    def full_disk(tensors: object, filename: str) -> None:
        Path(filename).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), filename)

    monkeypatch.setattr(snapshot_files, "save_file", full_disk)
    with pytest.raises(SnapshotWriteError, match=f"cannot write snapshot in {tmp_path}: No space left"):
        write(store)
    assert list(tmp_path.iterdir()) == []


def test_a_write_interrupted_by_any_exception_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    faults.reset()
    monkeypatch.setenv(faults.ENV, "snapshot.before_rename")
    with pytest.raises(faults.InjectedFault):
        write(SnapshotStore(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_prepare_removes_leftover_temporaries(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    write(store)
    leftover = tmp_path / ".tmp-0123abcd"
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"x" * 100)
    store.prepare(snapshot_bytes=100)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v000001"]


def test_prepare_keeps_the_temporaries_of_a_writer_still_running(tmp_path: Path) -> None:
    # a temporary names its writer's pid: another process's, alive, is a write in progress
    store = SnapshotStore(tmp_path)
    write(store)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) as running:
        try:
            names = [f".tmp-{running.pid}-0123abcd", f".tmp-{gone.pid}-4567ef01", f".tmp-{os.getpid()}-89ab"]
            for name in names:
                (tmp_path / name).mkdir()
            store.prepare(snapshot_bytes=100)
            assert sorted(p.name for p in tmp_path.iterdir()) == [names[0], "v000001"]
        finally:
            running.kill()
    store.prepare(snapshot_bytes=100)  # its writer gone now
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v000001"]


def test_prepare_refuses_a_regular_file(tmp_path: Path) -> None:
    path = tmp_path / "snapshots"
    path.write_text("not a directory")
    with pytest.raises(SnapshotDirError, match=f"snapshot directory {path} is not a directory"):
        SnapshotStore(path).prepare(snapshot_bytes=100)
    with pytest.raises(SnapshotDirError, match="is not a directory"):
        SnapshotStore(path).lock()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a 0o500 directory anyway")
def test_prepare_refuses_a_read_only_directory(tmp_path: Path) -> None:
    (tmp_path / ".lock").write_bytes(b"")  # from an earlier run: the lock alone would pass
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(SnapshotDirError, match="is not writable: Permission denied"):
            SnapshotStore(tmp_path).prepare(snapshot_bytes=100)
    finally:
        tmp_path.chmod(0o700)


@pytest.mark.skipif(not Path("/sys/kernel").is_dir(), reason="needs Linux sysfs")
def test_an_unwritable_directory_is_refused_even_for_root() -> None:
    """The sysfs file system refuses new entries to every user, root included."""
    store = SnapshotStore(Path("/sys/kernel"))
    with pytest.raises(SnapshotDirError, match="/sys/kernel"):
        store.lock()
    with pytest.raises(SnapshotDirError, match="/sys/kernel is not writable"):
        store.prepare(snapshot_bytes=100)


def test_prepare_demands_free_space_for_two_snapshots(tmp_path: Path) -> None:
    tight = SnapshotStore(tmp_path, free_bytes=lambda _: 150_000_000)
    tight.prepare(snapshot_bytes=50_000_000)
    with pytest.raises(SnapshotDirError, match=r"has 150\.0 MB free but needs 181\.0 MB"):
        tight.prepare(snapshot_bytes=90_000_000)
    with pytest.raises(SnapshotDirError, match="free some space"):  # more than the disk has
        SnapshotStore(tmp_path).prepare(snapshot_bytes=shutil.disk_usage(tmp_path).total)


def test_a_version_of_a_kind_this_release_does_not_know_stops_resume_and_says_so(tmp_path: Path) -> None:
    """Found by the snapshot tools tour (helper A): a version a later release wrote with a kind
    this one does not know (its manifest sealed) was skipped as damaged, and a learner resumed
    from the version before it, dropping what the later one trained, with a warning; `verify`
    called it "neither a full snapshot nor a delta". A later state layout stops resume instead
    (`test_verify_loads`); so does this, and both say a later release wrote it.
    """
    store = SnapshotStore(tmp_path)
    write(store, 1.0)
    write(store, 2.0)
    path = store.path(2) / MANIFEST
    doc = orjson.loads(path.read_bytes()) | {"kind": "sparse"}
    raw = orjson.dumps(doc)
    path.write_bytes(raw)
    (store.path(2) / MANIFEST_SUM).write_bytes(checksum_line(raw))
    said = "kind 'sparse' is not one this version reads (full, delta): a later streamrec release wrote it"
    with pytest.raises(InvalidSnapshot, match=re.escape(said)):
        store.latest_valid()
    result = CliRunner().invoke(app, ["snapshot", "verify", "--snapshot-dir", str(tmp_path)])
    assert result.exit_code == 1 and said in result.output, result.output
