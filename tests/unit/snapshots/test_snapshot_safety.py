"""Nothing in a snapshot directory is ever unpickled: planted or swapped pickles never run."""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from streamrec.cli import app
from streamrec.errors import InvalidSnapshot
from streamrec.snapshots.store import SnapshotStore
from tests.unit.snapshots.test_snapshot import write


class _Payload:
    """Unpickling this runs code: it creates ``canary``."""

    def __init__(self, canary: Path) -> None:
        self.canary = canary

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return exec, (f"open({str(self.canary)!r}, 'w').close()",)


def payload(canary: Path) -> bytes:
    return pickle.dumps(_Payload(canary))


def forge(store: SnapshotStore, version: int, files: dict[str, str]) -> None:
    """Rewrite a manifest naming ``files`` and re-seal it, as someone with write access could."""
    path = store.path(version) / "manifest.json"
    doc = orjson.loads(path.read_bytes()) | {"files": files}
    raw = orjson.dumps(doc)
    path.write_bytes(raw)
    (path.parent / "manifest.sha256").write_text(f"{hashlib.sha256(raw).hexdigest()}  manifest.json\n")


def touch_everything(store: SnapshotStore, version: int, tmp_path: Path) -> list[str]:
    """Every way a snapshot is read: load, verify, promote, listing, the CLI; returns refusals."""
    refusals = []
    for call in (store.load, store.verify, store.promote):
        try:
            call(version)
        except InvalidSnapshot as exc:
            refusals.append(str(exc))
    store.latest_valid()
    store.entries()
    for args in (["list"], ["verify"], ["show", str(version)], ["diff", "1", str(version)]):
        CliRunner().invoke(app, ["snapshot", *args, "--snapshot-dir", str(tmp_path)])
    return refusals


@pytest.fixture
def canary(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "canary"
    yield path
    live = tmp_path / "live-canary"  # the payload is real: unpickling it does create the file
    pickle.loads(payload(live))
    assert live.exists()


def test_planted_pickles_beside_a_snapshot_are_never_read(tmp_path: Path, canary: Path) -> None:
    store = SnapshotStore(tmp_path / "snaps")
    write(store)
    write(store)
    for name in ("model.pdparams", "evil.pkl", "optimizer.pdopt"):
        (store.path(2) / name).write_bytes(payload(canary))
    assert touch_everything(store, 2, store.root) == []  # its own files are intact
    manifest, tensors = store.load(2)
    assert sorted(tensors) == ["model", "state"]
    assert not canary.exists()


def test_a_safetensors_file_swapped_for_a_pickle_is_refused(tmp_path: Path, canary: Path) -> None:
    store = SnapshotStore(tmp_path / "snaps")
    write(store)
    write(store)
    weights = store.path(2) / "model.safetensors"
    weights.write_bytes(payload(canary))
    refusals = touch_everything(store, 2, store.root)
    assert refusals == [f"{weights} does not match its checksum"] * 3
    assert store.current() is None and not canary.exists()


def test_a_pickle_with_a_forged_manifest_is_refused(tmp_path: Path, canary: Path) -> None:
    """Checksums re-sealed to match the pickle: it still fails as a safetensors file."""
    store = SnapshotStore(tmp_path / "snaps")
    write(store)
    write(store)
    weights = store.path(2) / "model.safetensors"
    weights.write_bytes(payload(canary))
    forge(store, 2, {"model.safetensors": hashlib.sha256(weights.read_bytes()).hexdigest()})
    refusals = touch_everything(store, 2, store.root)
    assert len(refusals) == 3 and all(f"{weights} is not a safetensors file" in r for r in refusals)
    assert store.current() is None and not canary.exists()


@pytest.mark.parametrize("name", ["evil.pkl", "model.pdparams", "../v000001/model.safetensors"])
def test_a_manifest_naming_another_file_is_refused(tmp_path: Path, canary: Path, name: str) -> None:
    store = SnapshotStore(tmp_path / "snaps")
    write(store)
    write(store)
    target = store.path(2) / name
    if not target.exists():
        target.write_bytes(payload(canary))
    forge(store, 2, {name: hashlib.sha256(target.read_bytes()).hexdigest()})
    refusals = touch_everything(store, 2, store.root)
    assert len(refusals) == 3 and all("which is not a .safetensors file of its own" in r for r in refusals)
    assert store.current() is None and not canary.exists()
