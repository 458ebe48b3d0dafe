"""Other Kafka clients read what streamrec writes, as the README says they can."""

from __future__ import annotations

import asyncio

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from streamrec.config import StreamrecConfig
from streamrec.consumers.runner import ConsumerRunner
from streamrec.events import Event
from streamrec.producer import publish
from tests.integration.conftest import read_committed

Row = tuple[bytes | None, bytes | None, int]  # key, value, record timestamp


async def _read(bootstrap: str, topic: str, partitions: int, want: int) -> list[Row]:
    """Up to ``want`` records from the beginning (the embedded broker's end offsets are
    unreliable, so it reads until it has them, or until it stops getting any)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False
    )
    await consumer.start()
    try:
        parts = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        out: list[Row] = []
        quiet = 0
        while len(out) < want and quiet < 5:
            batches = await consumer.getmany(timeout_ms=1000)
            rows = [(m.key, m.value, m.timestamp) for msgs in batches.values() for m in msgs]
            quiet = 0 if rows else quiet + 1
            out += rows
        return out
    finally:
        await consumer.stop()


def test_aiokafka_reads_the_lz4_samples_read_committed(
    pipeline_config, clicks: list[Event]
) -> None:
    """Samples are lz4-compressed and transactional: aiokafka (with cramjam) reads them all."""
    cfg: StreamrecConfig = pipeline_config()
    publish(clicks[:500], cfg.kafka)
    ConsumerRunner(cfg).run()
    kafka = cfg.kafka
    records = read_committed(kafka.bootstrap_servers, kafka.samples_topic)
    expected = {(m.key(), m.value(), m.timestamp()[1]) for m in records}
    got = asyncio.run(_read(kafka.bootstrap_servers, kafka.samples_topic, kafka.partitions, len(expected)))
    assert len(got) == len(expected) > 500 and set(got) == expected
    for key, value, ts in got:  # key = user, record time = event time
        sample = orjson.loads(value or b"")
        assert key == sample["user_id"].encode() and ts == sample["ts"]
