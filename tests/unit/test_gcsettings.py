"""The collector settings: a batch's live objects set off no collection, cycles still go."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import gc, sys, weakref
from streamrec.gcsettings import tune_for_batches
if sys.argv[1] == "tuned":
    tune_for_batches()
runs = []
gc.callbacks.append(lambda phase, info: phase == "start" and runs.append(info["generation"]))
for _ in range(20):  # twenty batches of 20,000 live objects, freed when the batch is done
    batch = [[i] for i in range(20_000)]
    del batch
young = len(runs)

class Node:
    pass

garbage = []
for _ in range(120_000):  # cycles: only the collector frees them
    a, b = Node(), Node()
    a.b, b.a = b, a
    garbage.append(weakref.ref(a))
    del a, b
alive = sum(ref() is not None for ref in garbage)
print(young, alive, gc.get_freeze_count() > 0)
"""


def probe(mode: str) -> tuple[int, int, bool]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    young, alive, frozen = out.stdout.split()
    return int(young), int(alive), frozen == "True"


def test_live_batch_objects_set_off_no_collection_but_cycles_are_still_collected() -> None:
    young, alive, frozen = probe("tuned")
    assert young == 0 and frozen
    assert alive < 120_000  # the collector ran once the cycles passed the threshold
    default_young, _, _ = probe("default")
    assert default_young > 100  # the default ran over and over on the same batches
