"""Which partition a keyed record belongs in, by the partitioner every producer must share.

The consumers rely on each user's events coming through one partition: one consumer owns a
user at a time, a user's events keep their order, and the ``join`` mode finds a click in the
partition where its impression opened a window. Producers choose the partition, by a hash of
the key, and clients differ in the hash: the Java client (so Kafka Streams and Connect),
aiokafka and kafka-python take murmur2, librdkafka's clients (confluent-kafka in
every language, kcat) CRC32 unless told ``partitioner=murmur2_random``. Two producers with
different ones put most users in two partitions. `MURMUR2`, the Java client's, is the
default: the one most producers already use.

Records are checked a batch at a time: `murmur2` hashes a batch's keys together with
NumPy (the hash written in Python takes 3 us a key, a tenth of a consumer's whole work on an
event); no maintained Python package ships Kafka's murmur2 in C.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Final

import numpy as np

from streamrec.config import Partitioner

#: The Java client's partitioner: murmur2 of the key, its sign bit cleared, modulo the count.
MURMUR2: Final = "murmur2"
#: librdkafka's default (``consistent_random``): CRC32 of the key modulo the count.
CRC32: Final = "crc32"

_SEED, _M = 0x9747B28C, np.uint32(0x5BD1E995)


def murmur2(keys: Sequence[bytes]) -> np.ndarray:
    """Kafka's murmur2 of each key, as the Java client computes it.

    Kafka's murmur2 (``org.apache.kafka.common.utils.Utils.murmur2``) of each key, as
    unsigned 32-bit integers (uint32 arithmetic wraps as Java's int does).

    The keys are padded with zero bytes to one width and hashed together, four bytes a column:
    a key's own blocks mix into its hash and the columns past them do not, and its last one to
    three bytes are read with the padding after them, which the tail's XOR leaves unchanged.
    The only work a key costs in Python is its padding.
    """
    count = len(keys)
    lengths = np.fromiter(map(len, keys), dtype=np.uint32, count=count)  # a key may end in zeros
    h = np.uint32(_SEED) ^ lengths
    longest = int(lengths.max(initial=0))
    if not longest:
        return _finish(h)
    width = -(-longest // 4) * 4
    rows = np.zeros((count, width), dtype=np.uint8)
    rows[:, :longest] = np.array(keys, dtype=f"S{longest}").view(np.uint8).reshape(count, longest)
    blocks = rows.view("<u4")
    whole = lengths // np.uint32(4)  # each key's own blocks
    for column in range(width // 4):
        k = blocks[:, column] * _M
        k ^= k >> np.uint32(24)
        k *= _M
        h = np.where(whole > column, (h * _M) ^ k, h)
    tail, at = lengths % np.uint32(4), (whole * np.uint32(4)).astype(np.intp)
    index = np.arange(count)
    last = np.zeros(count, dtype=np.uint32)
    for shift in range(3):  # bytes past a key's end are padding: zero
        byte = rows[index, np.minimum(at + shift, width - 1)].astype(np.uint32)
        last ^= byte << np.uint32(8 * shift)
    h = np.where(tail > 0, (h ^ last) * _M, h)
    return _finish(h)


def _finish(h: np.ndarray) -> np.ndarray:
    """murmur2's final mix."""
    h = h.astype(np.uint32)
    h ^= h >> np.uint32(13)
    h *= _M
    h ^= h >> np.uint32(15)
    return h


def partitions_of(keys: Sequence[bytes], count: int, partitioner: Partitioner) -> list[int]:
    """The partition of ``count`` that ``partitioner`` gives each key.

    Examples:
        The two partitioners put the same users in different partitions:

        >>> partitions_of([b"u1", b"u2", b"u3"], 4, "murmur2")
        [0, 2, 2]
        >>> partitions_of([b"u1", b"u2", b"u3"], 4, "crc32")
        [2, 0, 2]
    """
    if partitioner == MURMUR2:
        return ((murmur2(keys) & np.uint32(0x7FFFFFFF)) % np.uint32(count)).tolist()
    return [zlib.crc32(key) % count for key in keys]
