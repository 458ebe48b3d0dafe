"""The heap settings: memory a training step frees is reused, not faulted in again."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

PROBE = """
import resource, sys
import numpy as np
from streamrec.heapsettings import keep_freed_memory
tuned = keep_freed_memory() if sys.argv[1] == "tuned" else None

def step():  # as a training step: a few MB a tensor, all freed when the step ends
    tensors = [np.ones(2**20, dtype=np.float32) for _ in range(10)]
    del tensors

step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print(tuned, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def probe(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    tuned, faults = out.stdout.split()
    return tuned, int(faults)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt: glibc only")
def test_freed_tensors_are_reused_without_page_faults() -> None:
    tuned, faults = probe("tuned")
    assert tuned == "True"
    # 20 steps x 10 tensors x 1,024 pages each: the defaults give every page back and fault
    # it in again; tuned, a step reuses the last one's pages.
    assert faults < 2_000
    _, default_faults = probe("default")
    assert default_faults > 100_000
