"""C heap settings for the processes that train: memory a step frees is kept for the next.

Paddle allocates every CPU tensor with malloc and frees it when the tensor dies: a training
step makes and frees hundreds, the largest a few MB ([mini-batch x T, H] float32, 3.3 MB at
the defaults). glibc's defaults hand such memory back to the kernel: a block above the mmap
threshold (128 KiB, rising with the blocks freed) is mapped and unmapped on its own, and free
space at the heap's top beyond the trim threshold (twice the mmap threshold) is given back.
The next step then faults every page in again, and the kernel zeroes each one. Measured on the
learner's bench loop (default DIN, MovieLens, 2,500-sample micro-batches, CPU): 4.4-5.9 x 10^5
page faults and 1.4-1.9 s of system time with the defaults, 0.86 x 10^5 and 0.47-0.65 s with
these settings, 6-15% less CPU time a sample. glibc only (``mallopt``); elsewhere a no-op.
"""

from __future__ import annotations

import ctypes
import sys

# mallopt's parameter numbers (glibc malloc.h).
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

#: Blocks below this come from the heap and are reused: above every per-step tensor (the
#: largest, a 2,048-sample scoring chunk's [chunk x 50, 64] float32 at --train-batch 1024, is
#: 26 MB) and below an embedding table (2^21 x 16 float32: 128 MiB), which is mapped apart and
#: handed back when a table grows. 32 MiB is also the most every 64-bit glibc accepts.
MMAP_THRESHOLD = 32 * 2**20
#: Free heap top kept rather than given back: a step's tensors together (tens of MB) with room
#: to spare; the learner holds several hundred MB of tables and optimizer state anyway.
TRIM_THRESHOLD = 256 * 2**20
#: Grow the heap this much beyond a request, so a step's first allocations take one call.
TOP_PAD = 64 * 2**20


def keep_freed_memory() -> bool:
    """Keep freed tensor memory in the heap for reuse (once per process, before training).

    Returns:
        Whether glibc took the settings (False off Linux or under another C library).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    settings = {_M_MMAP_THRESHOLD: MMAP_THRESHOLD, _M_TRIM_THRESHOLD: TRIM_THRESHOLD, _M_TOP_PAD: TOP_PAD}
    # mallopt returns 1 when it took a setting (musl's returns 0 and ignores them all).
    return all([mallopt(param, value) == 1 for param, value in settings.items()])
