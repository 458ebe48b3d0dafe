"""Stable hashing of string ids into fixed embedding-table buckets.

A stream keeps bringing new item and category ids, so the model hashes them into fixed tables
instead of keeping a vocabulary. The hash must be the same in every process and on every
machine (a snapshot trained here is served there), which rules out Python's salted ``hash()``.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

# Bucket 0 is the padding row of every embedding table; ids hash into 1..buckets-1.
PADDING_BUCKET = 0

# The murmur3 ``fmix64`` finaliser constants. CRC32 is linear, so ids that differ in one
# character land in related buckets; the finaliser spreads every input bit over the
# output before the modulo, so power-of-two bucket counts see well-mixed low bits.
_FMIX_C1 = np.uint64(0xFF51AFD7ED558CCD)
_FMIX_C2 = np.uint64(0xC4CEB9FE1A85EC53)
_SHIFT = np.uint64(33)


def bucketize(ids: Sequence[str], buckets: int) -> np.ndarray:
    """Hash string ids into ``1..buckets-1``, the same way in every process.

    Args:
        ids: The ids to hash (item or category ids).
        buckets: Rows of the embedding table, padding row 0 included; at least 2.

    Returns:
        An int64 array of ``len(ids)`` bucket numbers, each in ``1..buckets-1``.

    Raises:
        ValueError: If ``buckets`` is below 2 (no row would be left beside padding).
    """
    return to_buckets(fingerprint(ids), buckets)


def fingerprint(ids: Sequence[str]) -> np.ndarray:
    """The well-mixed 64-bit hash of each id, uint64: computed once, then bucketed per table."""
    crc = np.fromiter(map(zlib.crc32, map(str.encode, ids)), dtype=np.uint64, count=len(ids))
    return _fmix64(crc)


def to_buckets(fingerprints: np.ndarray, buckets: int) -> np.ndarray:
    """Map :func:`fingerprint` values into ``1..buckets-1`` (int64); row 0 stays padding."""
    if buckets < 2:
        raise ValueError(f"buckets must be at least 2, got {buckets}")
    return (fingerprints % np.uint64(buckets - 1)).astype(np.int64) + 1


def _fmix64(h: np.ndarray) -> np.ndarray:
    """Murmur3's 64-bit finaliser, vectorised; uint64 products wrap modulo 2**64 as intended."""
    h = h ^ (h >> _SHIFT)
    h = h * _FMIX_C1
    h = h ^ (h >> _SHIFT)
    h = h * _FMIX_C2
    return h ^ (h >> _SHIFT)
