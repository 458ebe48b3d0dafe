"""kill -9 at random moments of a process writing, promoting and pruning snapshots.

After every kill: each version listed valid loads with exactly the tensors written, the newest
valid one is never partial, the pointer names a valid version, every invalid or unfinished
version is refused by promote, and a restart removes the leftovers. With deltas on, every
valid delta loads bit-identical through its chain, and pruning never breaks a kept chain.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from streamrec.errors import InvalidSnapshot
from streamrec.snapshots.store import SnapshotStore

TRIALS = 20
# Each write is ~1 MB in three files and several fsyncs (a few ms): kills within this window
# land before, during and after writes, promotions and prunes.
KILL_AFTER_S = (0.005, 0.15)

CHILD = """
import sys
from pathlib import Path

import numpy as np

from streamrec.kafka.records import Position
from streamrec.snapshots.store import SnapshotStore
from tests.unit.snapshots.test_snapshot_kill import tensors

store = SnapshotStore(Path(sys.argv[1]), full_every=int(sys.argv[3]))
rng = np.random.default_rng(int(sys.argv[2]))
print("ready", flush=True)
n = 0
while True:
    n += 1
    seed = int(rng.integers(1 << 31))
    manifest = store.write(
        tensors(seed), micro_batches=n, samples_trained=n, positions=(Position("t", 0, n),),
        metrics={"seed": seed},
    )
    if n % 2 == 0:
        store.promote(manifest.version, reason="child")
    if n % 3 == 0:
        store.prune(3)
"""


def tensors(seed: int) -> dict[str, dict[str, np.ndarray]]:
    """What the child writes for ``seed``: the test regenerates it to compare. A fixed base
    with a few rows changed and a table of a varying length, so consecutive versions differ in
    some rows only (what deltas are for) and in shape now and then.
    """
    base = np.random.default_rng(0)
    rng = np.random.default_rng(seed)
    w = base.standard_normal((512 + 8 * (seed % 3), 256)).astype(np.float32)
    m = base.standard_normal((256, 256)).astype(np.float32)
    ids = base.integers(0, 1 << 40, 4096)
    w[rng.choice(len(w), 25, replace=False)] = rng.standard_normal((25, 256)).astype(np.float32)
    m[rng.choice(len(m), 12, replace=False)] = rng.standard_normal((12, 256)).astype(np.float32)
    ids[rng.integers(0, len(ids))] = seed
    return {"model": {"w": w}, "optimizer": {"m": m}, "state": {"ids": ids}}


def kill_at_random(root: Path, trial: int, delay: float, full_every: int = 1) -> None:
    repo = Path(__file__).resolve().parents[3]
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root), str(trial), str(full_every)],
        cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n", child.stderr and child.stderr.read()
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        _, err = child.communicate(timeout=10)
    finally:
        child.kill()
    assert child.returncode == -signal.SIGKILL, err


def check_after_kill(store: SnapshotStore) -> None:
    valid = []
    for entry in store.entries():
        if entry.problem is not None:
            with pytest.raises(InvalidSnapshot):
                store.promote(entry.version)
            continue
        manifest, loaded = store.load(entry.version)
        expected = tensors(manifest.metrics["seed"])
        assert loaded.keys() == expected.keys()
        for group, arrays in expected.items():
            for name, array in arrays.items():
                np.testing.assert_array_equal(loaded[group][name], array)
        valid.append(entry.version)
    found = store.latest_valid()
    assert (found and found[0].version) == (valid[-1] if valid else None)
    current = store.current()
    assert current is None or current in valid
    assert all(store.path(v).is_dir() for v in store.serving.retained(3))  # what prune(3) keeps
    unfinished = (store.versions() or [0])[-1] + 1  # the write the kill may have cut short
    with pytest.raises(InvalidSnapshot, match="no snapshot version"):
        store.promote(unfinished)


# 1: full snapshots only; 3: two deltas between full ones.
@pytest.mark.parametrize("full_every", [1, 3])
def test_kill_9_never_leaves_a_partial_version_or_pointer(tmp_path: Path, full_every: int) -> None:
    store = SnapshotStore(tmp_path / "snaps")
    rng = random.Random(9)
    leftovers = 0
    for trial in range(TRIALS):
        kill_at_random(store.root, trial, rng.uniform(*KILL_AFTER_S), full_every)
        check_after_kill(store)
        leftovers += bool(list(store.root.glob(".tmp-*")))
        store.prepare(snapshot_bytes=1)  # what a restarting learner does first
        assert not list(store.root.glob(".tmp-*"))
    assert len(store.history()) > 0 and len(store.versions()) > 0
    kinds = {m.kind for m in store.manifests()}
    assert kinds == ({"full"} if full_every == 1 else {"full", "delta"}), kinds
    print(f"{TRIALS} kills, {leftovers} left a temporary directory, {len(store.history())} promotions")
