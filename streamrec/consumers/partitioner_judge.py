"""Whether misplaced records mean that the consumers check by another partitioner than the producers'.

A record in another partition than ``STREAMREC_KAFKA__PARTITIONER`` gives its key is bad data
(a producer bug: one producer on another client's default beside the rest) or a
misconfiguration: every producer partitions by the other partitioner. The first is dead-lettered
record by record and the rest of the topic read. The second dead-letters all but the one key in
``count`` that both partitioners happen to put in one partition (7 of 8 events over 8 partitions,
measured), and trains on what is left as if it were the stream: the consumers stop, saying what
to set.

The rule, per partition: stop once `STOP_AFTER` of its records are misplaced, every one where
the other partitioner puts its key, before it reads any record that only the configured
partitioner puts there, or that neither does. Records both put there (coincidence) say nothing.
A partition whose records in a batch are all in place is settled too (the check does not hash
them twice), so a correctly placed record anywhere ends the partition's case for stopping; a topic
that legitimately holds a few misplaced records is read as before.
"""

from __future__ import annotations

from collections.abc import Iterable

from streamrec.config import Partitioner
from streamrec.kafka.records import Partition

#: Misplaced records of one partition, every one where the other partitioner puts its key, at
#: which the consumers stop: a topic written by the other partitioner reaches it within its first
#: ~115 records a partition (the 1 in ``count`` that both put in place do not count), while
#: a producer bug would have to misplace this many records in a row, from the partition's start
#: and with no correct record among them, to stop a consumer.
STOP_AFTER = 100
#: The other partitioner each one's misplaced records are checked against.
OTHER: dict[Partitioner, Partitioner] = {"murmur2": "crc32", "crc32": "murmur2"}
HOW: dict[Partitioner, str] = {
    "murmur2": "the Java client's default, and aiokafka's; librdkafka clients: partitioner=murmur2_random",
    "crc32": "librdkafka's default, consistent_random",
}


class PartitionerJudge:
    """Keeps each partition's evidence of another partitioner, and the verdict once it is in.

    Pure: the caller (`streamrec.consumers.placement.Placement`) tells it, for each record of a
    batch that holds misplaced ones, whether the configured partitioner and the other put it
    where it is; and which partitions a batch without misplaced records read.
    """

    def __init__(self, partitioner: Partitioner, stop_after: int = STOP_AFTER) -> None:
        """Judge records checked by ``partitioner``; stop at ``stop_after`` misplaced ones."""
        self.partitioner = partitioner
        self.other: Partitioner = OTHER[partitioner]
        self.stop_after = stop_after
        self.explained: dict[Partition, int] = {}  # misplaced records where `other` puts them
        self.settled: set[Partition] = set()  # partitions past the case for stopping
        self.verdict: str | None = None  # why the consumers must stop, once they must

    def record(self, where: Partition, right: bool, other_right: bool) -> None:
        """A record in ``where``: whether the configured partitioner, and the other, put it there."""
        if right and other_right:
            return  # both would: no evidence either way
        if right or not other_right:  # the configured partitioner's alone, or bad data
            self.settled.add(where)
            return
        count = self.explained.get(where, 0) + 1
        self.explained[where] = count
        if count >= self.stop_after and where not in self.settled and self.verdict is None:
            self.verdict = self._stop(where, count)

    def in_place(self, partitions: Iterable[Partition]) -> None:
        """Partitions whose records in a batch were all where the configured partitioner puts them."""
        self.settled.update(partitions)

    def _stop(self, where: Partition, count: int) -> str:
        return (
            f"{where}: its first {count} misplaced records are all where the {self.other} partitioner "
            f"puts their keys ({HOW[self.other]}), and it read none that only {self.partitioner} puts "
            f"there: the producers partition by {self.other}, the consumers check by "
            f"STREAMREC_KAFKA__PARTITIONER={self.partitioner}. Set STREAMREC_KAFKA__PARTITIONER="
            f"{self.other} (or republish the topic by {self.partitioner}); the batch that showed it was "
            "not processed, and misplaced records of batches before it are on the dead-letter topic"
        )
