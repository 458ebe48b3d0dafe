"""What a Kafka record is and where it sits, without a live client.

- `KafkaMessage`: the slice of ``confluent_kafka.Message`` that pure logic reads, so the
  consumers' logic and the aligner run on in-memory records too.
- `Record`: such a record held in memory, for replays, backtests and tests.
- `Partition` and `Position`: the one name for a partition and for a place in
  it (a record's offset, or the next offset to read); `advance_ends`: the next offsets past
  records.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from confluent_kafka import TIMESTAMP_CREATE_TIME, KafkaError, TopicPartition
from confluent_kafka._types import HeadersType

#: One header as confluent-kafka produces it: a name and a value (consumed ones are bytes).
Header = tuple[str, str | bytes | None]


class KafkaMessage(Protocol):
    """Structural type matching ``confluent_kafka.Message``."""

    def topic(self) -> str | None:
        """The topic the record was read from."""
        ...

    def partition(self) -> int | None:
        """The partition it was read from."""
        ...

    def offset(self) -> int | None:
        """Its offset in that partition."""
        ...

    def key(self) -> bytes | None:
        """Its key, or None."""
        ...

    def value(self) -> bytes | None:
        """Its value, or None (a tombstone)."""
        ...

    def timestamp(self) -> tuple[int, int]:
        """``(timestamp type, epoch ms)``: the producer's create time or the broker's append time."""
        ...

    def headers(self) -> HeadersType | None:
        """Its headers, or None."""
        ...

    def error(self) -> KafkaError | None:
        """The error a consumer delivers in place of a record, or None for a record."""
        ...


class Partition(NamedTuple):
    """One partition of one topic."""

    topic: str
    partition: int

    def __str__(self) -> str:
        """``topic[partition]``, as the logs write it."""
        return f"{self.topic}[{self.partition}]"


def partition_of(msg: KafkaMessage) -> Partition:
    """The partition a record came from.

    The partition a record came from (one shared value per partition: a batch asks this
    for each record).
    """
    where = (msg.topic(), msg.partition())
    key = _PARTITIONS.get(where)
    if key is None:
        key = _PARTITIONS[where] = Partition(where[0] or "", where[1] or 0)
    return key


_PARTITIONS: dict[tuple[str | None, int | None], Partition] = {}  # as many as partitions read


def offset_spans(
    records: Sequence[KafkaMessage], keys: Sequence[Partition]
) -> dict[Partition, tuple[int, int]]:
    """The first and last offset of the records of each partition.

    The first and last offset of the records of each partition (``keys``: each record's
    `partition_of`, which the caller has found already).
    """
    spans: dict[Partition, list[int]] = {}
    for msg, key in zip(records, keys, strict=True):
        offset = msg.offset() or 0
        span = spans.get(key)
        if span is None:
            spans[key] = [offset, offset]
        elif offset > span[1]:
            span[1] = offset
        elif offset < span[0]:  # a partition delivers in offset order: only if put back
            span[0] = offset
    return {key: (span[0], span[1]) for key, span in spans.items()}


def advance_ends(ends: dict[Partition, int], records: Iterable[KafkaMessage]) -> dict[Partition, int]:
    """``ends`` moved past ``records``: each partition's next offset after its highest record.

    Examples:
        >>> advance_ends({}, [Record(b"", 4, partition=1), Record(b"", 2, partition=1)])
        {Partition(topic='events', partition=1): 5}
    """
    for msg in records:
        key, offset = partition_of(msg), (msg.offset() or 0) + 1
        if offset > ends.get(key, 0):
            ends[key] = offset
    return ends


@dataclass(frozen=True, slots=True, order=True)
class Position:
    """A place in a partition: where a record was read, or the next offset to read there."""

    topic: str
    partition: int
    offset: int

    @property
    def key(self) -> Partition:
        """The partition this position is in."""
        return Partition(self.topic, self.partition)

    @classmethod
    def of(cls, msg: KafkaMessage) -> Position:
        """Where a consumed record was read (never unset for a data record)."""
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        if topic is None or partition is None or offset is None:
            raise ValueError("a record without a topic, partition or offset has no position")
        return cls(topic, partition, offset)

    def to_kafka(self) -> TopicPartition:
        """The confluent-kafka form, for seek and commit."""
        return TopicPartition(self.topic, self.partition, self.offset)


def event_time(msg: KafkaMessage) -> int:
    """A record's timestamp in epoch ms; streamrec's producers stamp it with the event time."""
    return msg.timestamp()[1]


class Record:
    """A record held in memory that satisfies `KafkaMessage`.

    For replays and backtests that feed recorded events to the consumers' logic without a
    broker.

    Examples:
        >>> record = Record(b'{"event_id": "e1"}', 7, topic="events", partition=2, key=b"u1")
        >>> Position.of(record), partition_of(record)
        (Position(topic='events', partition=2, offset=7), Partition(topic='events', partition=2))
    """

    __slots__ = (
        "_headers", "_key", "_offset", "_partition", "_timestamp", "_timestamp_type", "_topic", "_value"
    )

    def __init__(
        self,
        value: bytes | None,
        offset: int = 0,
        *,
        topic: str = "events",
        partition: int = 0,
        key: bytes | None = None,
        timestamp: int = 0,
        headers: list[Header] | None = None,
        timestamp_type: int = TIMESTAMP_CREATE_TIME,
    ) -> None:
        """A record held in memory.

        A record at ``topic[partition]`` ``offset`` holding ``value``, stamped ``timestamp``
        (by its producer, or ``TIMESTAMP_LOG_APPEND_TIME``: by the broker).
        """
        self._value, self._offset, self._topic = value, offset, topic
        self._partition, self._key, self._timestamp = partition, key, timestamp
        self._headers, self._timestamp_type = headers, timestamp_type

    def topic(self) -> str:
        """The topic the record was read from."""
        return self._topic

    def partition(self) -> int:
        """The partition it was read from."""
        return self._partition

    def offset(self) -> int:
        """Its offset in that partition."""
        return self._offset

    def key(self) -> bytes | None:
        """Its key, or None."""
        return self._key

    def value(self) -> bytes | None:
        """Its value, or None (a tombstone)."""
        return self._value

    def timestamp(self) -> tuple[int, int]:
        """``(timestamp type, epoch ms)``, as ``confluent_kafka.Message.timestamp``."""
        return self._timestamp_type, self._timestamp

    def headers(self) -> HeadersType | None:
        """A copy of its headers, or None."""
        return list(self._headers) if self._headers is not None else None

    def error(self) -> KafkaError | None:
        """Always None: a record in memory is never an error."""
        return None
