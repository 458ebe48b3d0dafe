"""`RecordSource.caught_up` on the real broker: every assigned partition read to its end."""

from __future__ import annotations

import time

from confluent_kafka import Message, Producer

from streamrec.config import KafkaConfig
from streamrec.kafka.clients import make_consumer
from streamrec.kafka.records import Partition
from streamrec.kafka.source import RecordSource
from streamrec.kafka.topics import ensure_topics


def two_partitions(bootstrap_servers: str, unique_name: str) -> tuple[KafkaConfig, Producer]:
    """A samples topic of two partitions, and a producer."""
    cfg = KafkaConfig(
        bootstrap_servers=bootstrap_servers, partitions=2,
        events_topic=f"e-{unique_name}", dlq_topic=f"d-{unique_name}",
        samples_topic=f"s-{unique_name}", samples_dlq_topic=f"sd-{unique_name}",
    )
    ensure_topics(cfg)
    return cfg, Producer({"bootstrap.servers": bootstrap_servers})


def drain(source: RecordSource, seconds: float) -> int:
    """Records polled for ``seconds``."""
    got, until = 0, time.monotonic() + seconds
    while time.monotonic() < until:
        got += len(source.poll(100, 0.1))
    return got


def first(source: RecordSource, size: int) -> list[Message]:
    """The first records that come, within 10 s."""
    until = time.monotonic() + 10.0
    while time.monotonic() < until:
        if got := source.poll(size, 0.1):
            return got
    raise AssertionError("no records came")


def test_a_source_is_caught_up_once_every_partition_it_reads_is_read_to_its_end(
    bootstrap_servers: str, unique_name: str
) -> None:
    """Records on one partition, none on the other (empty partitions end too); records put back
    or produced later are not caught up until read.
    """
    cfg, producer = two_partitions(bootstrap_servers, unique_name)
    for n in range(50):
        producer.produce(cfg.samples_topic, value=b"%d" % n, partition=0)
    assert producer.flush(10) == 0
    source = RecordSource(make_consumer(cfg, f"g-{unique_name}"), [cfg.samples_topic], None, start_at={})
    try:
        assert not source.caught_up()  # nothing assigned
        source.assign([Partition(cfg.samples_topic, 0), Partition(cfg.samples_topic, 1)])
        assert not source.caught_up()  # nothing read yet
        read = first(source, 10)
        assert not source.caught_up()  # 40 or more still to read on partition 0
        assert len(read) + drain(source, 3.0) == 50
        assert source.caught_up()
        source.unread(read[:1])
        assert not source.caught_up()  # a record put back waits
        assert len(source.poll(100, 0.1)) == 1 and source.caught_up()
        producer.produce(cfg.samples_topic, value=b"late", partition=1)
        assert producer.flush(10) == 0
        assert [m.value() for m in first(source, 100)] == [b"late"]
        drain(source, 1.0)  # its end again
        assert source.caught_up()
    finally:
        source.close()


def test_an_aligned_source_with_a_silent_partition_waits_for_it_once_not_at_every_poll(
    bootstrap_servers: str, unique_name: str
) -> None:
    """Alignment waits ``IDLE_MS`` (2 s) for a partition with nothing to read. It waited again at
    each poll after the first, so polls of 30 took 2 s each: 90 at most in 6 s, not 300.
    """
    cfg, producer = two_partitions(bootstrap_servers, unique_name)
    for n in range(300):
        producer.produce(cfg.samples_topic, value=b"%d" % n, partition=0, timestamp=1_511_658_000_000 + n)
    assert producer.flush(10) == 0
    source = RecordSource(make_consumer(cfg, f"g-{unique_name}"), [cfg.samples_topic], 60_000, start_at={})
    try:
        source.assign([Partition(cfg.samples_topic, 0), Partition(cfg.samples_topic, 1)])
        got, until = 0, time.monotonic() + 6.0
        while got < 300 and time.monotonic() < until:
            got += len(source.poll(30, 0.1))
        assert got == 300
    finally:
        source.close()



def test_a_poll_for_more_than_librdkafka_takes_at_once_is_served(
    bootstrap_servers: str, unique_name: str
) -> None:
    """Found by the consumers tour: ``STREAMREC_CONSUMER__BATCH_SIZE=2000000`` (or a learner's
    micro-batch over a million samples) ended the run in a traceback at its first poll:
    ``ValueError: num_messages must be between 0 and 1000000 (1M)``, librdkafka's limit on one
    consume call. A poll asks for at most that much; a batch is a maximum, and the rest comes next.
    """
    cfg, producer = two_partitions(bootstrap_servers, unique_name)
    values = [b"%d" % n for n in range(20)]
    for value in values:
        producer.produce(cfg.samples_topic, value=value, partition=0)
    producer.flush(10)
    source = RecordSource(make_consumer(cfg, f"g-{unique_name}"), [cfg.samples_topic], None, start_at={})
    source.assign([Partition(cfg.samples_topic, p) for p in (0, 1)])
    try:
        assert len(first(source, 2_000_000)) + drain(source, 2.0) == len(values)
    finally:
        source.close()
