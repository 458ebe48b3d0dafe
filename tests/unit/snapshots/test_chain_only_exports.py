"""Retention drops the exports of versions kept only for a kept delta's chain (nothing serves them).

Found by tour R: keep 2 and a full snapshot every 5 left 8 versions and 8 exports (136 of the
directory's 153 MB) where 4 of those exports served nothing.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import orjson
from typer.testing import CliRunner, Result

from streamrec.cli import app
from streamrec.snapshots.exports import export_dir
from streamrec.snapshots.store import SnapshotStore
from streamrec.snapshots.traffic import write_plan
from tests.support import trained_snapshots
from tests.unit.snapshots.test_snapshot_delta import evolve, model_state, put
from tests.unit.snapshots.test_traffic import canary_plan


def fake_export(root: Path, version: int) -> Path:
    """An export whose checksums hold (what promotion checks without serve's reading)."""
    path = export_dir(root, version)
    path.mkdir(parents=True)
    (path / "model.pdiparams").write_bytes(b"weights")
    manifest = orjson.dumps({"files": {"model.pdiparams": hashlib.sha256(b"weights").hexdigest()}})
    (path / "manifest.json").write_bytes(manifest)
    (path / "manifest.sha256").write_text(hashlib.sha256(manifest).hexdigest())
    return path


def exported(store: SnapshotStore) -> list[int]:
    return [v for v in store.versions() if export_dir(store.root, v).is_dir()]


def test_prune_deletes_the_exports_of_versions_only_a_kept_delta_needs(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, full_every=4)
    state = model_state()
    for step in range(7):  # v1 full, v2-v4 deltas, v5 full, v6-v7 deltas
        state = evolve(state, step)
        fake_export(tmp_path, put(store, state).version)
    store.promote(3)
    assert store.prune(1) == [4]
    assert store.versions() == [1, 2, 3, 5, 6, 7]  # every snapshot a kept delta needs stays
    assert exported(store) == [3, 7]  # the served and the newest; v1, v2, v5, v6 are chain-only
    assert not export_dir(tmp_path, 4).exists()
    for version in store.versions():
        store.load(version)  # the chain-only versions' snapshots load as before


def test_prune_keeps_the_exports_of_a_plans_and_the_rollback_targets(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, full_every=10)
    state = model_state()
    for step in range(6):  # v1 full, v2-v6 deltas
        state = evolve(state, step)
        fake_export(tmp_path, put(store, state).version)
    for version in (2, 3):
        store.promote(version)
    write_plan(tmp_path, canary_plan(4, 500))
    assert store.prune(1) == []
    # v6 newest; v3 served and v2 its rollback target; v4 the canary; v1 and v5 chain-only
    assert exported(store) == [2, 3, 4, 6]


def snapshot(root: Path, *args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(app, ["snapshot", *args, "--snapshot-dir", str(root)])
    assert result.exit_code == code, result.output
    return result


def test_a_chain_only_version_is_not_damage_and_promote_or_rebuild_builds_its_export(tmp_path: Path) -> None:
    store = trained_snapshots(tmp_path, count=4, full_every=10)  # v1 full, v2-v4 deltas, all exported
    store.promote(4)
    assert store.prune(1) == []
    assert exported(store) == [4]
    verify = snapshot(tmp_path, "verify")  # exit 0: no export is no damage
    assert "v000002  ok; export missing (`streamrec snapshot export 2` builds it)" in verify.stdout
    assert "missing" in snapshot(tmp_path, "list").stdout
    assert snapshot(tmp_path, "show", "2").stdout
    snapshot(tmp_path, "diff", "1", "4")
    snapshot(tmp_path, "export", "1", "--rebuild")
    assert export_dir(tmp_path, 1).is_dir()
    promoted = snapshot(tmp_path, "promote", "2")
    assert "v000002 had no export: built" in promoted.output
    assert snapshot(tmp_path, "rollback").exit_code == 0  # back to v4, whose export was kept
    assert store.serving.current() == 4
    assert store.prune(1) == []
    assert exported(store) == [2, 4]  # v2 was served (before the rollback): kept with its export
    canary = snapshot(tmp_path, "canary", "3", "--share", "5%")
    assert "v000003 had no export: built" in canary.output
    assert store.prune(1) == [] and exported(store) == [2, 3, 4]  # the canary's export is kept
    snapshot(tmp_path, "canary", "--abort")
    assert store.prune(1) == [] and exported(store) == [2, 4]


def test_prune_says_which_exports_it_deleted_where_no_version_went(tmp_path: Path) -> None:
    """Found by tour T: `snapshot prune --keep 2` printed `nothing to delete (keeping 2)` while it
    deleted two chain-only versions' exports, 63 MB of a full snapshot directory's 130.
    """
    store = SnapshotStore(tmp_path, full_every=10)
    state = model_state()
    for step in range(4):  # v1 full, v2-v4 deltas, each exported
        state = evolve(state, step)
        fake_export(tmp_path, put(store, state).version)
    store.promote(1)
    out = snapshot(tmp_path, "prune", "--keep", "1").stdout
    assert exported(store) == [1, 4] and store.versions() == [1, 2, 3, 4]
    assert "nothing to delete" not in out
    assert "deleted the exports of v000002, v000003 (their snapshots kept: a kept delta needs them)" in out
    assert "4 kept" in out
    fake_export(tmp_path, 2)
    doc = orjson.loads(snapshot(tmp_path, "prune", "--keep", "1", "--json").stdout)
    assert doc == {"keep": 1, "deleted": [], "exports_deleted": [2], "kept": [1, 2, 3, 4]}
    assert "nothing to delete (keeping 1)" in snapshot(tmp_path, "prune", "--keep", "1").stdout
