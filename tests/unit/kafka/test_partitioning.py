"""Kafka's murmur2, batched: the Java client's values, and aiokafka's on random keys."""

from __future__ import annotations

import random
import zlib

import numpy as np
import pytest
from aiokafka.partitioner import murmur2 as aiokafka_murmur2

from streamrec.kafka.partitioning import CRC32, MURMUR2, murmur2, partitions_of

# org.apache.kafka.common.utils.UtilsTest#testMurmur2: the Java client's own values.
JAVA = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def test_murmur2_gives_the_java_clients_values() -> None:
    got = murmur2(list(JAVA)).astype(np.int32)  # Java's int: the same bits, signed
    assert dict(zip(JAVA, got.tolist(), strict=True)) == JAVA


def test_murmur2_agrees_with_aiokafka_on_keys_of_every_length_in_one_batch() -> None:
    rng = random.Random(7)
    keys = [rng.randbytes(rng.randrange(0, 70)) for _ in range(3_000)] + [b""]
    assert murmur2(keys).tolist() == [aiokafka_murmur2(k) & 0xFFFFFFFF for k in keys]


@pytest.mark.parametrize("count", [1, 3, 4, 64])
def test_partitions_as_the_java_client_and_librdkafka_put_keyed_records(count: int) -> None:
    keys = [f"user-{k}".encode() for k in range(500)]
    assert partitions_of(keys, count, MURMUR2) == [(aiokafka_murmur2(k) & 0x7FFFFFFF) % count for k in keys]
    assert partitions_of(keys, count, CRC32) == [zlib.crc32(k) % count for k in keys]


def test_no_keys_no_partitions() -> None:
    assert partitions_of([], 4, MURMUR2) == [] and murmur2([]).shape == (0,)
