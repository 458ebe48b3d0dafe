"""Delta snapshots against full ones: bytes and write time by the fraction of rows changed.

A model-state-like dict (an embedding table of ``--rows`` x ``--dim`` float32, its two Adam
moments, a few small dense layers and a 1-D bool array of known rows) is written full, then
with ``--fractions`` of its rows changed (the same rows in the table and both moments), each
as a delta on the full one and as a full snapshot. Reported per fraction: the tensor-file
bytes of the delta and of the full snapshot, their ratio (about the fraction changed is the
goal), both write times (median of ``--repeats``), and whether the delta chain loads back
bit-identical to what was written.

    .venv/bin/python bench/snapshot_delta.py [--rows N] [--dim N] [--repeats N]

Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from streamrec.kafka.records import Position
from streamrec.snapshots.store import SnapshotStore

Tensors = dict[str, dict[str, np.ndarray]]


def model_state(rows: int, dim: int) -> Tensors:
    """Shaped like a DIN learner's state: a table, its Adam moments, dense layers, known rows."""
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((rows, dim)).astype(np.float32)
    dense = {f"mlp.{i}.weight": rng.standard_normal((64, 64)).astype(np.float32) for i in range(3)}
    return {
        "model": {"emb": emb, **dense, "mlp.out.bias": np.zeros(1, np.float32)},
        "optimizer": {"emb/moment1": emb * np.float32(0.1), "emb/moment2": emb * emb},
        "state": {"known": np.zeros(rows, np.bool_), "shuffle": np.array([7, 1], np.int64)},
    }


def changed(state: Tensors, fraction: float, seed: int) -> Tensors:
    """A copy of ``state`` after a simulated micro-batch.

    A copy of ``state`` after a micro-batch touching ``fraction`` of the table's rows (the
    dense layers all change, as they do in training).
    """
    rng = np.random.default_rng(seed)
    out = {group: {name: a.copy() for name, a in arrays.items()} for group, arrays in state.items()}
    emb = out["model"]["emb"]
    rows = rng.choice(len(emb), int(len(emb) * fraction), replace=False)
    for array in (emb, out["optimizer"]["emb/moment1"], out["optimizer"]["emb/moment2"]):
        array[rows] += rng.standard_normal((len(rows), emb.shape[1])).astype(np.float32)
    for name, array in out["model"].items():
        if name.startswith("mlp."):
            array += np.float32(1e-3)
    out["state"]["known"][rows] = True
    out["state"]["shuffle"][1] += 1
    return out


def tensor_bytes(store: SnapshotStore, version: int) -> int:
    """Bytes of a version's tensor files on disk."""
    return sum(p.stat().st_size for p in store.path(version).glob("*.safetensors"))


def write(store: SnapshotStore, state: Tensors) -> tuple[int, float]:
    """Write ``state`` as the next version: its number and the seconds the write took."""
    start = time.perf_counter()
    manifest = store.write(state, micro_batches=1, samples_trained=1, positions=(Position("t", 0, 1),))
    return manifest.version, time.perf_counter() - start


def identical(a: Tensors, b: Tensors) -> bool:
    """Whether two states hold the same groups, names and values."""
    return a.keys() == b.keys() and all(
        a[g].keys() == b[g].keys()
        and all(x.dtype == b[g][k].dtype and x.shape == b[g][k].shape and x.tobytes() == b[g][k].tobytes()
                for k, x in a[g].items())
        for g in a
    )


def measure(root: Path, base: Tensors, fraction: float, repeats: int) -> dict[str, object]:
    """Delta and full writes of ``base`` with ``fraction`` of its rows changed."""
    delta_s, full_s, ok = [], [], True
    delta_bytes = full_bytes = 0
    for repeat in range(repeats):
        after = changed(base, fraction, seed=repeat + 1)
        deltas = SnapshotStore(root / f"delta-{fraction}-{repeat}", full_every=10)
        fulls = SnapshotStore(root / f"full-{fraction}-{repeat}")
        write(deltas, base)
        version, seconds = write(deltas, after)
        delta_s.append(seconds)
        delta_bytes = tensor_bytes(deltas, version)
        assert deltas.manifest(version).kind == "delta"
        version, seconds = write(fulls, after)
        full_s.append(seconds)
        full_bytes = tensor_bytes(fulls, version)
        ok = ok and identical(SnapshotStore(deltas.root).load(2)[1], after)
    return {
        "fraction_rows_changed": fraction,
        "delta_bytes": delta_bytes,
        "full_bytes": full_bytes,
        "bytes_ratio": round(delta_bytes / full_bytes, 4),
        "delta_write_s": round(statistics.median(delta_s), 4),
        "full_write_s": round(statistics.median(full_s), 4),
        "chain_equals_written": ok,
    }


def chain_load(root: Path, base: Tensors, length: int) -> dict[str, object]:
    """A full snapshot and ``length - 1`` deltas of 1% each: the last loads bit-identical."""
    store = SnapshotStore(root / "chain", full_every=length)
    state = base
    for step in range(length):
        state = changed(state, 0.01, seed=100 + step) if step else state
        write(store, state)
    start = time.perf_counter()
    _, loaded = SnapshotStore(store.root).load(length)
    seconds = time.perf_counter() - start
    kinds = [m.kind for m in store.manifests()]
    return {"length": length, "kinds_delta": kinds.count("delta"), "load_s": round(seconds, 4),
            "chain_equals_written": identical(loaded, state)}


def main() -> None:
    """Measure and print the figures (``--help`` lists the knobs)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.01, 0.05, 0.2])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    base = model_state(args.rows, args.dim)
    with tempfile.TemporaryDirectory() as tmp:
        runs = [measure(Path(tmp), base, f, args.repeats) for f in args.fractions]
        for run in runs:
            print(run)
        chain = chain_load(Path(tmp), base, 10)
    print(json.dumps({
        "bench": "snapshot_delta",
        "rows": args.rows,
        "dim": args.dim,
        "state_bytes": sum(a.nbytes for arrays in base.values() for a in arrays.values()),
        "bytes_ratio": {str(r["fraction_rows_changed"]): r["bytes_ratio"] for r in runs},
        "runs": runs,
        "chain_of_10": chain,
        "chain_equals_written": all(r["chain_equals_written"] for r in [*runs, chain]),
    }))


if __name__ == "__main__":
    main()
