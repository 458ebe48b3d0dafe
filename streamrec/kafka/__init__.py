"""Kafka plumbing: clients, topics, record positions, event-time alignment, the record source.

`KafkaMessage` is the slice of a ``confluent_kafka.Message`` pure logic reads, and
`Record` one held in memory; `Partition` and `Position` name a partition
and a place in it. `RecordSource` owns one consumer's partitions. Clients are made with
`make_consumer` and `make_producer` from a `KafkaConfig`;
`ensure_topics` creates the topics the pipeline uses.
"""

from __future__ import annotations

from streamrec.lazy import lazy_exports

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads either)
if TYPE_CHECKING:
    from streamrec.kafka.clients import make_consumer, make_producer
    from streamrec.kafka.records import KafkaMessage, Partition, Position, Record
    from streamrec.kafka.source import RecordSource
    from streamrec.kafka.topics import ensure_topics

__all__ = [
    "KafkaMessage",
    "Partition",
    "Position",
    "Record",
    "RecordSource",
    "ensure_topics",
    "make_consumer",
    "make_producer",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "streamrec.kafka.clients": ["make_consumer", "make_producer"],
        "streamrec.kafka.records": ["KafkaMessage", "Partition", "Position", "Record"],
        "streamrec.kafka.source": ["RecordSource"],
        "streamrec.kafka.topics": ["ensure_topics"],
    },
)
