"""Serving pointer: promote, rollback, history, retention; atomic and crash-safe."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import orjson
import pytest

from streamrec.errors import InvalidSnapshot, SnapshotError
from streamrec.snapshots import directory as snapshot_dir
from streamrec.snapshots.exports import export_dir
from streamrec.snapshots.store import SnapshotStore
from tests.unit.snapshots.test_snapshot import write


def corrupt(store: SnapshotStore, version: int, name: str = "model.safetensors") -> Path:
    path = store.path(version) / name
    data = path.read_bytes()
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    return path


def test_nothing_promoted_at_first(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    write(store)
    assert store.current() is None and store.promoted() == [] and store.history() == []
    with pytest.raises(SnapshotError, match="nothing to roll back"):
        store.rollback()


def test_promote_points_serving_at_a_verified_version(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    write(store)
    write(store)
    manifest = store.promote(2, reason="canary ok")
    assert manifest == store.manifest(2)
    assert store.current() == 2 and store.promoted() == [2]
    assert (tmp_path / "serving" / "CURRENT").read_text() == "v000002\n"
    assert stat.S_IMODE((tmp_path / "serving" / "CURRENT").stat().st_mode) == 0o644
    lines = (tmp_path / "serving" / "history.jsonl").read_bytes().splitlines()
    event = orjson.loads(lines[0])
    assert (event["action"], event["version"], event["previous"], event["reason"]) == (
        "promote", 2, None, "canary ok",
    )
    store.promote(1)
    assert [(e.action, e.version, e.previous) for e in store.history()] == [
        ("promote", 2, None), ("promote", 1, 2),
    ]
    assert store.promoted() == [2, 1]
    assert sorted(p.name for p in (tmp_path / "serving").iterdir()) == [".lock", "CURRENT", "history.jsonl"]
    assert store.versions() == [1, 2]  # the serving directory is no version


def test_promote_refuses_an_invalid_version_naming_the_file(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    write(store)
    write(store)
    store.promote(1)
    bad = corrupt(store, 2)
    with pytest.raises(InvalidSnapshot, match=f"{bad} does not match its checksum"):
        store.promote(2)
    with pytest.raises(InvalidSnapshot, match="no snapshot version v000007"):
        store.promote(7)
    (store.path(2) / "manifest.sha256").unlink()
    with pytest.raises(InvalidSnapshot, match="manifest.sha256 is missing"):
        store.promote(2)
    assert store.current() == 1 and store.promoted() == [1]


def test_rollback_walks_back_through_promotions(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    for _ in range(4):
        write(store)
    for version in (1, 2, 3):
        store.promote(version)
    assert store.rollback() == 2 and store.current() == 2
    assert store.rollback() == 1 and store.current() == 1
    with pytest.raises(SnapshotError, match="no earlier promoted valid version .* from v000001"):
        store.rollback()
    store.promote(4)
    assert store.rollback() == 1  # 2 and 3 were rolled back from, not served before 4
    assert store.promoted() == [1, 2, 3, 4]
    assert [e.action for e in store.history()] == ["promote"] * 3 + ["rollback"] * 2 + ["promote", "rollback"]


def test_rollback_skips_a_version_that_became_invalid(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    for _ in range(3):
        write(store)
    for version in (1, 2, 3):
        store.promote(version)
    corrupt(store, 2)
    assert store.rollback(reason="bad metrics") == 1
    assert store.history()[-1].reason == "bad metrics" and store.history()[-1].previous == 3
    corrupt(store, 1)
    store.promote(3)
    with pytest.raises(SnapshotError, match=r"from v000003 \(invalid: v000001\)"):  # 2 was skipped
        store.rollback()
    assert store.current() == 3


def test_a_torn_history_line_is_skipped_and_the_next_starts_afresh(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    write(store)
    write(store)
    store.promote(1)
    with (tmp_path / "serving" / "history.jsonl").open("ab") as fh:
        fh.write(b'{"time": "2024-01-01T00:00:0')  # a crash mid-append
    store.promote(2)
    assert [e.version for e in store.history()] == [1, 2]
    assert store.rollback() == 1


def test_a_history_ahead_of_current_rolls_back_from_current(tmp_path: Path) -> None:
    """A crash after the history line, before the pointer moved: CURRENT still rules."""
    store = SnapshotStore(tmp_path)
    for _ in range(3):
        write(store)
    store.promote(1)
    store.promote(2)
    with store.serving.locked():
        store.serving.record("promote", 3, 2, "crashed before the pointer moved")
    assert store.current() == 2 and store.promoted() == [1, 2, 3]
    assert store.rollback() == 1


def test_an_unreadable_pointer_is_an_error_until_a_promotion_repairs_it(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    write(store)
    store.promote(1)
    (tmp_path / "serving" / "CURRENT").write_text("garbage\n")
    with pytest.raises(SnapshotError, match="names no version"):
        store.current()
    store.promote(1)
    assert store.current() == 1


def test_an_unreadable_pointer_stops_no_prune_which_keeps_every_version_the_history_names(
    tmp_path: Path,
) -> None:
    """A garbage CURRENT made the learner's prune after each snapshot raise, stopping it. The
    history is written before the pointer moves, so it names every version serving could load.
    """
    store = SnapshotStore(tmp_path)
    for _ in range(5):
        write(store)
    store.promote(2)
    (tmp_path / "serving" / "CURRENT").write_text("garbage\n")
    assert store.promoted() == [2]
    assert store.prune(1) == [1, 3, 4]
    assert store.versions() == [2, 5]


def test_pointer_updates_wait_for_each_other_not_for_the_learner(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    write(store)
    with store.lock():  # the learner's lock: an operator still promotes
        store.promote(1)
    other = SnapshotStore(tmp_path)
    with store.serving.locked(), pytest.raises(SnapshotError, match="stayed locked for 0s"):
        with other.serving.locked(timeout_s=0.1):
            pass
    with other.serving.locked(timeout_s=0.1):
        pass


def test_resolve_names_versions(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    with pytest.raises(SnapshotError, match="no valid snapshot"):
        store.resolve("latest")
    write(store)
    write(store)
    write(store)
    corrupt(store, 3)
    assert [store.resolve(s) for s in ("v000003", "3", "V2", "latest")] == [3, 3, 2, 2]
    with pytest.raises(SnapshotError, match=r"no version v000007 in .*: it holds v000001, v000002, v000003"):
        store.resolve("7")
    with pytest.raises(SnapshotError, match="no version is promoted"):
        store.resolve("current")
    store.promote(1)
    assert store.resolve("current") == 1
    with pytest.raises(SnapshotError, match="'x7' is not a version"):
        store.resolve("x7")


# --- retention -------------------------------------------------------------------------------


def test_prune_keeps_the_newest_and_every_promoted_version(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    for _ in range(7):
        write(store)
    store.promote(2)
    store.promote(3)
    store.rollback()
    assert store.prune(0) == []  # 0 keeps all
    assert store.prune(2) == [1, 4, 5]
    assert store.versions() == [2, 3, 6, 7]
    assert store.prune(2) == []
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["serving", "v000002", "v000003", "v000006", "v000007"]
    assert store.current() == 2
    with pytest.raises(SnapshotError, match="keep_last must be 0"):
        store.prune(-1)


def test_prune_never_deletes_the_newest_valid_version(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    for _ in range(4):
        write(store)
    corrupt(store, 4)
    corrupt(store, 3)
    assert store.prune(1) == [1, 3]
    assert store.versions() == [2, 4]
    found = store.latest_valid()
    assert found is not None and found[0].version == 2


def test_a_prune_cut_short_leaves_a_temporary_the_next_start_removes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SnapshotStore(tmp_path)
    for _ in range(3):
        write(store)
    monkeypatch.setattr(snapshot_dir.shutil, "rmtree", lambda *a, **k: None)  # killed before rmtree
    assert store.prune(1) == [1, 2]
    monkeypatch.undo()
    assert store.versions() == [3]
    assert len(list(tmp_path.glob(".tmp-*-deleted-v00000*"))) == 2
    store.prepare(snapshot_bytes=100)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["serving", "v000003"]


def fake_export(store: SnapshotStore, version: int) -> Path:
    """An export as the store checks it: files, their checksums, the manifest's own."""
    path = store.root / "exports" / f"v{version:06d}"
    path.mkdir(parents=True)
    (path / "model.pdiparams").write_bytes(bytes(range(256)) * 8)
    raw = orjson.dumps({"version": version, "files": {
        "model.pdiparams": hashlib.sha256((path / "model.pdiparams").read_bytes()).hexdigest(),
    }})
    (path / "manifest.json").write_bytes(raw)
    (path / "manifest.sha256").write_text(f"{hashlib.sha256(raw).hexdigest()}  manifest.json\n")
    return path / "model.pdiparams"


def test_promote_and_rollback_refuse_a_damaged_export_naming_the_file(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    for _ in range(3):
        write(store)
    params = {v: fake_export(store, v) for v in (1, 2, 3)}
    store.promote(1)
    store.promote(2)
    params[3].write_bytes(params[3].read_bytes()[:100])  # truncated
    with pytest.raises(InvalidSnapshot, match=f"{params[3]} does not match its checksum"):
        store.promote(3)
    params[1].write_bytes(b"\xff" + params[1].read_bytes()[1:])  # one byte changed
    with pytest.raises(SnapshotError, match=r"from v000002 \(invalid: v000001\)"):
        store.rollback()
    assert store.current() == 2 and store.promoted() == [1, 2]


def test_a_missing_export_is_built_first_or_refused(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    write(store)
    write(store)
    built: list[int] = []

    def build(version: int) -> Path:
        built.append(version)
        return fake_export(store, version).parent

    store.promote(2, build_export=build)
    assert built == [2] and store.current() == 2

    def cannot(version: int) -> Path:
        raise InvalidSnapshot(f"cannot export v{version:06d}")

    with pytest.raises(InvalidSnapshot, match="cannot export v000001"):
        store.promote(1, build_export=cannot)
    assert store.current() == 2
    store.promote(1, build_export=lambda _: None)  # nothing to export: a store without a model
    assert store.current() == 1


def test_list_and_show_work_with_an_unreadable_pointer_and_warn_about_it(tmp_path: Path) -> None:
    """A garbage CURRENT made `snapshot list` and `show` exit 1: an operator could not list the
    versions to choose one to promote.
    """
    from typer.testing import CliRunner

    from streamrec.cli import app

    store = SnapshotStore(tmp_path)
    write(store)
    write(store)
    store.promote(1)
    (tmp_path / "serving" / "CURRENT").write_text("garbage\n")
    runner = CliRunner()
    listed = runner.invoke(app, ["snapshot", "list", "--snapshot-dir", str(tmp_path)])
    assert listed.exit_code == 0, listed.output
    assert "v000001" in listed.stdout and "v000002" in listed.stdout and "promoted" in listed.stdout
    assert "warning:" in listed.stderr and "names no version ('garbage')" in listed.stderr
    as_json = runner.invoke(app, ["snapshot", "list", "--json", "--snapshot-dir", str(tmp_path)])
    doc = orjson.loads(as_json.stdout)
    assert doc["current"] is None and "names no version" in doc["pointer_problem"]
    shown = runner.invoke(app, ["snapshot", "show", "2", "--snapshot-dir", str(tmp_path)])
    assert shown.exit_code == 0, shown.output
    assert "v000002" in shown.stdout and "names no version" in shown.stderr


def test_a_mistyped_snapshot_dir_is_an_error_and_nothing_is_created_under_it(tmp_path: Path) -> None:
    """`snapshot verify --snapshot-dir /nope` said "no snapshots", exit 0; rollback and prune
    created /nope/serving/.lock. `list` then still said "no snapshots", exit 0, `show 1` that
    /nope/v000001/manifest.json is missing, and `create` made /nope/.requests and waited a minute.
    """
    from typer.testing import CliRunner

    from streamrec.cli import app

    missing = tmp_path / "nope"
    store = SnapshotStore(missing)
    for act in (store.rollback, lambda: store.prune(1), lambda: store.promote(1)):
        with pytest.raises(SnapshotError, match="no snapshot directory"):
            act()
    assert not missing.exists()
    commands = [
        ["verify"], ["rollback"], ["prune", "--keep", "1"], ["list"], ["list", "--json"], ["show", "1"],
        ["show", "latest"], ["diff", "1", "2"], ["export", "1"], ["materialize", "1", str(tmp_path / "out")],
        ["create", "--timeout", "0"], ["canary", "1", "--share", "5%"], ["ab", "1=50%", "2=50%"],
    ]
    for args in commands:
        result = CliRunner().invoke(app, ["snapshot", *args, "--snapshot-dir", str(missing)])
        assert result.exit_code == 1 and "no snapshot directory" in result.output, result.output
    assert not missing.exists()


def test_a_version_that_is_not_there_is_named_as_missing_not_as_unexported(tmp_path: Path) -> None:
    """`snapshot verify 99` listed v000099 as invalid with "export missing (`streamrec snapshot
    export 99` builds it)"; `show 99` said v000099/manifest.json is missing.
    """
    from typer.testing import CliRunner

    from streamrec.cli import app

    store = SnapshotStore(tmp_path)
    for _ in range(12):
        write(store)
    for args in (["verify", "99"], ["show", "99"], ["export", "v000099"], ["diff", "1", "99"],
                 ["promote", "99"], ["materialize", "99", str(tmp_path.parent / "out")]):
        result = CliRunner().invoke(app, ["snapshot", *args, "--snapshot-dir", str(tmp_path)])
        assert result.exit_code == 1, result.output
        held = "it holds 12, v000001 to v000012: `streamrec snapshot list` names them"
        line = f"error: no version v000099 in {tmp_path}: {held}"
        assert result.output.replace("\n", "") == line, result.output
    assert not (tmp_path.parent / "out").exists()


def test_promoting_the_served_version_changes_nothing_and_records_nothing(tmp_path: Path) -> None:
    """Noted by a tour: ``snapshot promote 3`` with v000003 served wrote a history line
    (``promote 3, previous 3``) and said "serving v000003 (was v000003)". The history is the
    pointer's moves, which rollback steps back through and the listings show.
    """
    from typer.testing import CliRunner

    from streamrec.cli import app

    store = SnapshotStore(tmp_path)
    write(store)
    write(store)
    store.promote(1)
    store.promote(2)
    history = (tmp_path / "serving" / "history.jsonl").read_bytes()
    assert store.promote(2) == store.manifest(2)
    result = CliRunner().invoke(app, ["snapshot", "promote", "2", "--snapshot-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "v000002 is served already: nothing changed"
    result = CliRunner().invoke(app, ["snapshot", "promote", "2", "--json", "--snapshot-dir", str(tmp_path)])
    assert orjson.loads(result.output) == {
        "current": 2, "name": "v000002", "previous": 2, "ended": None, "changed": False
    }
    assert (tmp_path / "serving" / "history.jsonl").read_bytes() == history
    assert store.rollback() == 1  # one step back, as before
    result = CliRunner().invoke(app, ["snapshot", "promote", "2", "--json", "--snapshot-dir", str(tmp_path)])
    assert orjson.loads(result.output)["changed"] is True and store.current() == 2


def own_export(store: SnapshotStore, version: int, contract: dict[str, object]) -> Path:
    """A whole export of a learner that exports itself, with ``contract`` as its contract.json."""
    path = store.root / "exports" / f"v{version:06d}"
    path.mkdir(parents=True)
    (path / "contract.json").write_bytes(orjson.dumps(contract))
    files = {"contract.json": hashlib.sha256((path / "contract.json").read_bytes()).hexdigest()}
    raw = orjson.dumps({"version": version, "files": files})
    (path / "manifest.json").write_bytes(raw)
    (path / "manifest.sha256").write_text(f"{hashlib.sha256(raw).hexdigest()}  manifest.json\n")
    return path


@pytest.mark.parametrize(
    "contract",
    [
        {"version": 2, "output": "rate.npy[0]"},  # no inputs at all
        {"version": 2, "inputs": [{"name": "user_id", "dtype": "string"}]},  # inputs of its own kind
    ],
    ids=["own-form", "own-inputs"],
)
def test_an_export_serve_does_not_load_is_promoted_only_for_a_server_of_ones_own(
    tmp_path: Path, contract: dict[str, object]
) -> None:
    """Noted by a tour: ``snapshot promote`` took a custom learner's own export, which
    ``streamrec serve`` then refused at its start ("cannot be served by streamrec"), or, running,
    logged at each poll while serving the version before. A team scoring it with a server of its
    own that follows serving/CURRENT (as its contract.json says) promotes it with --own-server.
    """
    from typer.testing import CliRunner

    from streamrec.cli import app
    from streamrec.cli.snapshot_common import serve_check
    from streamrec.errors import NotServable

    store = SnapshotStore(tmp_path)
    write(store)
    write(store)
    fake_export(store, 1)
    store.promote(1)
    own_export(store, 2, contract)
    with pytest.raises(NotServable, match="cannot be served by streamrec"):
        store.promote(2, serve_check=serve_check(store))
    with pytest.raises(InvalidSnapshot, match="v000001 is damaged: .*contract.json cannot be served from"):
        store.promote(1, serve_check=serve_check(store))  # no contract at all: serve would not load it
    result = CliRunner().invoke(app, ["snapshot", "promote", "2", "--snapshot-dir", str(tmp_path)])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "cannot be served by streamrec" in lines[0], result.output
    assert "`streamrec snapshot promote 2 --own-server`" in lines[0]
    assert store.current() == 1 and [e.version for e in store.history()] == [1]
    args = ["snapshot", "promote", "2", "--own-server", "--snapshot-dir", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert store.current() == 2 and [e.version for e in store.history()] == [1, 2]


def test_retention_is_bounded_when_every_snapshot_is_promoted(tmp_path: Path) -> None:
    """Under ``promote=always`` (or a gate that passes) every version is promoted, and retention
    kept every version ever promoted: a learner with KEEP_SNAPSHOTS=3 held 120 versions and 120
    exports after 120 micro-batches (found by the long-run tour). It keeps the served one, the
    ones a rollback steps back to and the ones served most recently, ``keep_last`` of each.
    """
    store = SnapshotStore(tmp_path)
    for _ in range(40):
        store.promote(write(store).version)
        store.prune(3)
    assert store.versions() == [37, 38, 39, 40]  # 40 served, 37-39 a rollback's targets
    assert store.promoted() == list(range(1, 41))  # the history still names them all
    assert (store.rollback(), store.rollback(), store.rollback()) == (39, 38, 37)
    assert store.prune(3) == []  # 38-40 the ones served most recently
    assert store.versions() == [37, 38, 39, 40]


def test_retention_keeps_the_rollback_targets_after_a_rollback(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    for _ in range(8):
        write(store)
    for version in (2, 3, 4, 5):
        store.promote(version)
    store.rollback()  # to 4; 3 and 2 are what the next rollbacks take
    assert store.prune(1) == [1, 2, 6, 7]
    assert store.versions() == [3, 4, 5, 8]  # 3 a rollback's, 4 served, 5 served just before
    assert store.rollback() == 3


def test_prune_deletes_the_exports_of_the_versions_it_deletes(tmp_path: Path) -> None:
    """`streamrec snapshot prune --keep 1` on four exported versions left all four exports (only
    the learner's next export swept them): the docs say it deletes the versions and their exports.
    """
    store = SnapshotStore(tmp_path)
    for _ in range(4):
        version = write(store).version
        (export_dir(tmp_path, version) / "model").mkdir(parents=True)
    assert store.prune(1) == [1, 2, 3]
    assert sorted(p.name for p in (tmp_path / "exports").iterdir()) == ["v000004"]
