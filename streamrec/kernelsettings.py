"""Intel MKL's matrix kernels on AMD processors: its vector code, not its generic path.

Paddle's CPU wheel does its matrix products in the MKL it ships (MKLML), which picks its code
by the processor's vendor: on an AMD processor it takes a generic path that leaves AVX2, FMA
and AVX-512 unused. This MKL honours ``MKL_DEBUG_CPU_TYPE``, which names the code to take:
``5`` its AVX2 code, ``7`` its AVX-512 code for Xeon processors (the value Google's
PerfKitBenchmarker passes with ``MKL_ENABLE_INSTRUCTIONS=AVX512``).

Measured (Paddle 3.3.1, one thread, matmul at the attention's shape [12,800 x 128] x [128 x 64]
and at 2048^3; bench/HISTORY.md):

- an AMD EPYC with AVX2 and no AVX-512 (2026-12-03): 10-21 GFLOP/s at the attention's shape
  without the variable, 22-60 with ``5``; the learner benchmark's process 21-27 CPU seconds
  against 30-37, alternately;
- an AMD EPYC with AVX-512 (family 26, 2026-12-04): 27-39 / 39-42 GFLOP/s without it, 49-75 /
  106-117 with ``5``, 73-80 / 174-214 with ``7``; results within float32 rounding of float64
  products on every path;
- an Intel Xeon with AVX-512, where MKL takes its own AVX-512 path (125-135 GFLOP/s): held to
  AVX2 by ``5`` it ran slower (93-95). So nothing is set on Intel processors.

So on an AMD processor it is set to ``7`` where the processor has the AVX-512 subsets that
code uses (F, CD, BW, DQ, VL: Skylake's, which Zen 4 and later have), else to ``5`` where it
has AVX2 and FMA, and never over an operator's own value.

MKL reads the variable at its first matrix product, not when Paddle is imported: call this
before the process's first product (the learner's commands do it first thing).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path

#: The variable this MKL reads to choose its code path, and its values for AVX2 and AVX-512.
MKL_CPU_TYPE = "MKL_DEBUG_CPU_TYPE"
AVX2 = "5"
AVX512 = "7"

#: What each path needs of the processor (Linux's /proc/cpuinfo flag names).
AVX2_FLAGS = frozenset({"avx2", "fma"})
AVX512_FLAGS = AVX2_FLAGS | {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}

CPUINFO = Path("/proc/cpuinfo")


def mkl_cpu_type(cpuinfo: str) -> str | None:
    """The ``MKL_DEBUG_CPU_TYPE`` for the processor ``cpuinfo`` describes (None: leave MKL's).

    Args:
        cpuinfo: ``/proc/cpuinfo``'s text (its first processor's vendor and flags are read).
    """
    vendor, flags = "", set[str]()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "vendor_id" and not vendor:
            vendor = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    if vendor != "AuthenticAMD":
        return None
    if AVX512_FLAGS <= flags:
        return AVX512
    if AVX2_FLAGS <= flags:
        return AVX2
    return None


def prefer_vector_kernels(
    environ: MutableMapping[str, str] | None = None, cpuinfo: Path = CPUINFO
) -> bool:
    """Set ``MKL_DEBUG_CPU_TYPE`` where MKL would otherwise take its generic path.

    Args:
        environ: The environment to set it in (default: the process's).
        cpuinfo: Where the processor is described (Linux's; elsewhere nothing is set).

    Returns:
        Whether it was set now (False: not an AMD processor with AVX2, no ``/proc/cpuinfo``,
        or the operator set the variable).
    """
    env = os.environ if environ is None else environ
    if MKL_CPU_TYPE in env:
        return False
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    value = mkl_cpu_type(text)
    if value is None:
        return False
    env[MKL_CPU_TYPE] = value
    return True
