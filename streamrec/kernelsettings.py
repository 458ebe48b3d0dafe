"""Intel MKL's matrix kernels on AMD processors: its AVX2 code, not its generic path.

Paddle's CPU wheel does its matrix products in the MKL it ships (MKLML), which picks its code
by the processor's vendor: on an AMD processor it takes a generic path that leaves AVX2 and FMA
unused. The learner's step is mostly matrix products (Paddle's profiler on the bench loop: the
products and their gradients about 70% of a training step), so there it runs at a fraction of
the machine. This MKL honours ``MKL_DEBUG_CPU_TYPE=5``, which makes it take its AVX2 code.

Measured on an AMD EPYC with AVX2 and no AVX-512 (2026-12-03, Paddle 3.3.1, one thread):
Paddle's matmul at the attention's shape ([12,800 x 128] x [128 x 64]) 10-21 GFLOP/s without
it, 22-60 with it (numpy's OpenBLAS up to 129-134 on the same machine); the learner benchmark's
process 21-27 CPU seconds against 30-37, alternately (bench/HISTORY.md). An earlier sitting,
on a machine whose MKL already ran these products at 125-135 GFLOP/s, measured the variable
slower (93-95): a processor with AVX-512, whose own path MKL takes, loses by being held to
AVX2. So it is set on AMD processors with AVX2 and without AVX-512 only, and never over an
operator's own value.

MKL reads the variable at its first matrix product, not when Paddle is imported: call this
before the process's first product (the learner's commands do it first thing).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path

#: The variable this MKL reads to choose its code path, and the value for its AVX2 code.
MKL_CPU_TYPE = "MKL_DEBUG_CPU_TYPE"
AVX2 = "5"

CPUINFO = Path("/proc/cpuinfo")


def wants_avx2_kernels(cpuinfo: str) -> bool:
    """Whether ``cpuinfo`` (``/proc/cpuinfo``'s text) is an AMD processor with AVX2 and no AVX-512."""
    vendor, flags = "", set[str]()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "vendor_id" and not vendor:
            vendor = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return vendor == "AuthenticAMD" and "avx2" in flags and "fma" in flags and "avx512f" not in flags


def prefer_avx2_kernels(
    environ: MutableMapping[str, str] | None = None, cpuinfo: Path = CPUINFO
) -> bool:
    """Set ``MKL_DEBUG_CPU_TYPE=5`` where MKL would otherwise take its generic path.

    Args:
        environ: The environment to set it in (default: the process's).
        cpuinfo: Where the processor is described (Linux's; elsewhere nothing is set).

    Returns:
        Whether it was set now (False: not an AMD processor with AVX2 and without AVX-512,
        no ``/proc/cpuinfo``, or the operator set the variable).
    """
    env = os.environ if environ is None else environ
    if MKL_CPU_TYPE in env:
        return False
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    if not wants_avx2_kernels(text):
        return False
    env[MKL_CPU_TYPE] = AVX2
    return True
