"""Delta snapshots: changed rows only, a full one every K, chains load bit-identical."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import orjson
import pytest
from safetensors.numpy import load_file
from typer.testing import CliRunner

from streamrec.cli import app
from streamrec.config import StreamrecConfig
from streamrec.errors import InvalidSnapshot, SnapshotError
from streamrec.kafka.records import Position
from streamrec.snapshots.delta import ROWS_SUFFIX
from streamrec.snapshots.store import SnapshotManifest, SnapshotStore
from tests.unit.snapshots.test_promotion import corrupt

Tensors = dict[str, dict[str, np.ndarray]]


def put(store: SnapshotStore, tensors: Tensors, n: int = 1) -> SnapshotManifest:
    return store.write(tensors, micro_batches=n, samples_trained=n, positions=(Position("t", 0, n),))


def assert_bit_identical(got: Tensors, want: Tensors) -> None:
    assert got.keys() == want.keys()
    for group, arrays in want.items():
        assert got[group].keys() == arrays.keys(), group
        for name, array in arrays.items():
            loaded = got[group][name]
            assert (loaded.dtype, loaded.shape) == (array.dtype, array.shape), f"{group}/{name}"
            assert loaded.tobytes() == array.tobytes(), f"{group}/{name}"  # bitwise: NaN, -0.0


def model_state(rows: int = 1000, seed: int = 0) -> Tensors:
    rng = np.random.default_rng(seed)
    emb = rng.standard_normal((rows, 16)).astype(np.float32)
    return {
        "model": {"emb": emb, "bias": rng.standard_normal(8).astype(np.float32), "step": np.array(3.0)},
        "optimizer": {"emb/moment1": emb * 0.1, "emb/moment2": emb * emb},
        "state": {"known": np.zeros(rows, np.bool_), "seed": np.array([7, 1], np.int64)},
    }


def evolve(prev: Tensors, seed: int, fraction: float = 0.01) -> Tensors:
    """A copy of ``prev`` with ``fraction`` of the embedding rows (and their moments) changed."""
    rng = np.random.default_rng(seed)
    out = {group: {name: array.copy() for name, array in arrays.items()} for group, arrays in prev.items()}
    n = len(out["state"]["known"])
    rows = rng.choice(n, int(n * fraction), replace=False)
    for array in (out["model"]["emb"], out["optimizer"]["emb/moment1"], out["optimizer"]["emb/moment2"]):
        array[rows] += rng.standard_normal((len(rows), 16)).astype(np.float32)
    out["model"]["bias"] += np.float32(0.5)
    out["state"]["known"][rows] = True
    return out


def test_a_chain_loads_bit_identical_across_growth_and_added_and_removed_tensors(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, full_every=4)
    states = [model_state()]
    for step in range(1, 10):
        s = evolve(states[-1], step)
        if step == 2:  # NaN payloads and signed zeros differ only in bits
            s["model"]["emb"][5] = np.float32(-0.0)
            s["model"]["emb"][6] = np.frombuffer(np.uint32(0x7FC00001).tobytes(), np.float32)[0]
        if step == 3:  # a table grows, a new tensor and a new tensor file appear
            grown = np.arange(1050 * 16, dtype=np.float32).reshape(1050, 16)
            grown[:1000] = s["model"]["emb"]
            s["model"]["emb"] = grown
            s["model"]["half"] = np.ones((4, 2), np.float16)
            s["extra"] = {"ids": np.arange(5, dtype=np.int32)}
        if step == 5:  # a tensor and a tensor file go; a table shrinks; a dtype changes
            del s["model"]["half"], s["extra"]
            s["model"]["emb"] = s["model"]["emb"][:1020].copy()
            s["state"]["seed"] = s["state"]["seed"].astype(np.int32)
        if step == 6:
            s["model"]["emb"][6] = np.frombuffer(np.uint32(0x7FC00002).tobytes(), np.float32)[0]
        states.append(s)
    manifests = [put(store, s, n) for n, s in enumerate(states)]
    assert [(m.kind, m.parent) for m in manifests] == [
        ("full", None), ("delta", 1), ("delta", 2), ("delta", 3),
        ("full", None), ("delta", 5), ("delta", 6), ("delta", 7),
        ("full", None), ("delta", 9),
    ]
    assert manifests[3].delta["model"]["rows"]["emb"] == 1050
    assert manifests[5].delta["model"]["removed"] == ["half"]
    fresh = SnapshotStore(tmp_path)
    for manifest, state in zip(manifests, states, strict=True):
        loaded_manifest, loaded = fresh.load(manifest.version)
        assert loaded_manifest == manifest
        assert_bit_identical(loaded, state)
    assert [e.problem for e in fresh.entries()] == [None] * 10
    assert fresh.chain(8) == [5, 6, 7, 8]


def test_a_delta_holds_only_the_changed_rows(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, full_every=10)
    base = model_state(rows=20_000)
    put(store, base)
    delta = put(store, evolve(base, 1, fraction=0.01))
    full_bytes = sum(p.stat().st_size for p in store.path(1).glob("*.safetensors"))
    delta_bytes = sum(p.stat().st_size for p in store.path(2).glob("*.safetensors"))
    assert delta_bytes < 0.03 * full_bytes, (delta_bytes, full_bytes)
    rows = orjson.loads((store.path(2) / "manifest.json").read_bytes())["delta"]["model"]["rows"]
    assert rows == {"emb": 20_000}
    assert delta.delta["optimizer"]["rows"].keys() == {"emb/moment1", "emb/moment2"}
    raw = load_file(str(store.path(2) / "model.safetensors"))
    assert raw["emb"].shape == (200, 16) and raw["emb" + ROWS_SUFFIX].dtype == np.int64
    assert "step" not in raw  # unchanged: the parent's stands


def test_full_every_one_writes_only_full_snapshots(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    state = model_state()
    for step in range(3):
        state = evolve(state, step)
        assert put(store, state).kind == "full"
    with pytest.raises(SnapshotError, match="full_every must be 1"):
        SnapshotStore(tmp_path, full_every=0)


def test_a_broken_chain_invalidates_the_deltas_on_it_naming_the_version(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SnapshotStore(tmp_path, full_every=5)
    state = model_state()
    for step in range(4):
        state = evolve(state, step)
        put(store, state)
    bad = corrupt(store, 2)
    for version in (3, 4):
        problem = store.validate(version)
        assert problem is not None and "is a delta on v000002, which is not valid" in problem
        assert str(bad) in problem
    assert [e.problem is None for e in store.entries()] == [True, False, False, False]
    found = store.latest_valid()
    assert found is not None and found[0].version == 1
    assert "v000004" in caplog.text and str(bad) in caplog.text
    with pytest.raises(InvalidSnapshot, match="v000003 is a delta on v000002"):
        store.promote(3)
    with pytest.raises(InvalidSnapshot, match=str(bad)):
        store.load(4)
    shutil.rmtree(store.path(2))
    problem = store.validate(3)
    assert problem is not None and f"no snapshot version v000002 in {tmp_path}" in problem
    assert store.resolve("latest") == 1


def test_prune_keeps_every_version_a_kept_delta_needs(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, full_every=4)
    state = model_state()
    for step in range(7):  # v1 full, v2-v4 deltas, v5 full, v6-v7 deltas
        state = evolve(state, step)
        put(store, state)
    store.promote(3)
    assert store.prune(1) == [4]  # v7 needs v5 and v6; the promoted v3 needs v1 and v2
    assert store.versions() == [1, 2, 3, 5, 6, 7]
    for version in store.versions():
        store.load(version)
    store.promote(7)
    store.serving.current_path.unlink()
    (store.root / "serving" / "history.jsonl").unlink()
    assert store.prune(1) == [1, 2, 3]
    _, loaded = store.load(7)
    assert_bit_identical(loaded, state)


def test_a_store_continues_the_chain_of_the_newest_version_it_loaded(tmp_path: Path) -> None:
    writer = SnapshotStore(tmp_path, full_every=3)
    state = model_state()
    put(writer, state)
    state = evolve(state, 1)
    put(writer, state)
    resumed = SnapshotStore(tmp_path, full_every=3)
    found = resumed.latest_valid()
    assert found is not None
    assert_bit_identical(found[1], state)
    found[1]["model"]["emb"][:] = 0  # the caller's copy: not the parent of the next delta
    state = evolve(state, 2)
    assert (put(resumed, state).kind, put(resumed, evolve(state, 3)).kind) == ("delta", "full")
    assert_bit_identical(resumed.load(3)[1], state)
    # An older version loaded, or a newer one on disk, is no parent: the next one is full.
    older = SnapshotStore(tmp_path, full_every=3)
    older.load(2)
    assert put(older, state).kind == "full"
    assert put(writer, state).kind == "full"


def forge(store: SnapshotStore, version: int, **changes: object) -> None:
    path = store.path(version) / "manifest.json"
    raw = orjson.dumps(orjson.loads(path.read_bytes()) | changes)
    path.write_bytes(raw)
    (path.parent / "manifest.sha256").write_text(f"{hashlib.sha256(raw).hexdigest()}  manifest.json\n")


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"parent": 2}, "neither a full snapshot nor a delta on an earlier version"),
        ({"parent": None}, "neither a full snapshot nor a delta"),
        ({"kind": "patch"}, "kind 'patch'"),
        ({"delta": {}}, "row indices emb/__rows__ for a tensor the delta does not patch"),
        ({"delta": {"model": {"rows": {"emb": 10}}, "optimizer": {"rows": {"emb/moment1": 1000,
                                                                           "emb/moment2": 1000}}}},
         "model:emb: the row patch does not fit"),
        ({"delta": {"model": {"rows": {"emb": 1001}}, "optimizer": {"rows": {"emb/moment1": 1000,
                                                                             "emb/moment2": 1000}}}},
         "model:emb: the row patch leaves grown rows unset"),
        ({"delta": {"ghost": {"removed": ["x"]}}}, "describes ghost"),
    ],
)
def test_a_forged_delta_manifest_is_refused(tmp_path: Path, changes: dict[str, object], match: str) -> None:
    store = SnapshotStore(tmp_path, full_every=3)
    state = model_state()
    put(store, state)
    put(store, evolve(state, 1))
    forge(store, 2, **changes)
    with pytest.raises(InvalidSnapshot, match=match):
        store.load(2)


def test_snapshot_list_and_show_tell_full_from_delta(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, full_every=3)
    state = model_state()
    put(store, state)
    put(store, evolve(state, 1))
    out = CliRunner().invoke(app, ["snapshot", "list", "--snapshot-dir", str(tmp_path)], terminal_width=200)
    assert out.exit_code == 0, out.output
    kinds = {
        cells[0]: cells[2]
        for line in out.output.splitlines()
        if (cells := [c.strip() for c in line.strip("│ ").split("│")])[0].startswith("v0")
    }
    assert kinds == {"v000001": "full", "v000002": "delta of v000001"}
    out = CliRunner().invoke(app, ["snapshot", "show", "2", "--snapshot-dir", str(tmp_path), "--json"])
    doc = orjson.loads(out.stdout)
    assert (doc["kind"], doc["parent"], doc["valid"]) == ("delta", 1, True)
    out = CliRunner().invoke(app, ["snapshot", "show", "2", "--snapshot-dir", str(tmp_path)])
    assert "kind" in out.stdout and "delta of v000001" in out.stdout


def test_full_snapshot_every_is_configured_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert StreamrecConfig().learner.full_snapshot_every == 10
    monkeypatch.setenv("STREAMREC_LEARNER__FULL_SNAPSHOT_EVERY", "1")
    assert StreamrecConfig().learner.full_snapshot_every == 1


def test_materialize_writes_every_tensor_of_a_delta_version_in_full(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snapshots", full_every=4)
    states = [model_state()]
    for step in range(1, 4):
        states.append(evolve(states[-1], step))
    states[2]["model"]["emb"][5] = np.float32(-0.0)  # bits, not values, must come back
    manifests = [put(store, s, n) for n, s in enumerate(states)]
    assert manifests[3].kind == "delta" and manifests[3].parent == 3
    out = tmp_path / "full" / "v000004"
    out.parent.mkdir()
    result = CliRunner().invoke(
        app, ["snapshot", "materialize", "4", str(out), "--snapshot-dir", str(store.root), "--json"]
    )
    assert result.exit_code == 0, result.output
    assert orjson.loads(result.stdout)["path"] == str(out)
    # an outside reader: only safetensors and the manifest, no streamrec chain logic
    read = {p.name.removesuffix(".safetensors"): load_file(str(p)) for p in out.glob("*.safetensors")}
    assert_bit_identical(read, states[3])
    copy = SnapshotStore(out.parent)
    manifest, loaded = copy.load(4)
    assert (manifest.kind, manifest.parent, manifest.delta) == ("full", None, {})
    assert manifest.positions == manifests[3].positions
    assert_bit_identical(loaded, states[3])
    args = ["snapshot", "materialize", "4", str(out), "--snapshot-dir", str(store.root)]
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 1 and "exists" in again.output


def test_a_nan_metric_does_not_restart_the_chain(tmp_path: Path) -> None:
    """A version whose metrics held a NaN (``known_auc`` of a micro-batch of new ids, the AUC of
    one of one class) made the next snapshot full: the store compared its in-memory manifest,
    NaN, with the one on disk, null, and took the version for another writer's (found by the
    long-run tour: a learner at FULL_SNAPSHOT_EVERY=2 wrote full, full, delta, full).
    """
    store = SnapshotStore(tmp_path, full_every=3)
    state = model_state()
    first = store.write(state, micro_batches=1, samples_trained=1, positions=(Position("t", 0, 1),),
                        metrics={"auc": float("nan"), "known_auc": None})
    state = evolve(state, 1)
    second = store.write(state, micro_batches=2, samples_trained=2, positions=(Position("t", 0, 2),),
                         metrics={"auc": float("nan")})
    assert (first.kind, second.kind, put(store, evolve(state, 2)).kind) == ("full", "delta", "delta")
    assert_bit_identical(store.load(2)[1], state)


@pytest.mark.parametrize("inside", ["v000009", "exports/v000007", "full"])
def test_materialize_refuses_a_directory_inside_the_snapshot_directory(tmp_path: Path, inside: str) -> None:
    """Found by the snapshot tools tour (helper A): `materialize 3 <snapshots>/v000009` wrote a
    version directory there whose manifest says 3, which `list` and `verify` then called invalid
    (`manifest.json is of version 3, not 9`) and which a learner's next version numbered after;
    under ``exports/`` it stood where that version's export goes.
    """
    store = SnapshotStore(tmp_path / "snapshots")
    for step in range(3):
        put(store, evolve(model_state(), step), step)
    (store.root / "exports").mkdir()
    out = store.root / inside
    args = ["snapshot", "materialize", "3", str(out), "--snapshot-dir", str(store.root)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    said = f"error: {out} is inside the snapshot directory {store.root}"
    assert result.output.startswith(said), result.output
    assert len(result.output.strip().splitlines()) == 1 and not out.exists()
    assert store.versions() == [1, 2, 3]


def test_retention_peaks_at_keep_plus_full_every_plus_one_versions(tmp_path: Path) -> None:
    """What sizing.md plans disk by (versions; a chain-only one has no export): found by the soak tour,
    whose directory held 14 versions and 518 MB at ``keep`` 3, where the docs said 3 versions'
    room. As in the learner: a prune after each snapshot, and the gate promotes it after that,
    by the micro-batch that follows.
    """
    keep, full_every = 2, 5
    store = SnapshotStore(tmp_path, full_every=full_every)
    state = model_state()
    peak = 0
    for step in range(4 * full_every):
        state = evolve(state, step)
        version = put(store, state).version
        store.prune(keep)
        peak = max(peak, len(store.versions()))
        store.promote(version)
    assert peak == keep + full_every + 1
