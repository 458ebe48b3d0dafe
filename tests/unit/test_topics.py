"""Which positions a topic no longer holds."""

from __future__ import annotations

from streamrec.kafka.records import Partition
from streamrec.kafka.topics import expired_positions

P0, P1, P2 = (Partition("s", n) for n in range(3))


def test_positions_before_the_earliest_offset_left_have_expired() -> None:
    assert expired_positions({P0: 5, P1: 10, P2: 3}, {P0: 0, P1: 12, P2: 3}) == {P1: (10, 12)}
    assert expired_positions({P0: 5}, {}) == {}  # unknown partitions are not judged
