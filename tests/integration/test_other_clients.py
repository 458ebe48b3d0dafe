"""Other Kafka clients read what streamrec writes, as the README says they can."""

from __future__ import annotations

import asyncio

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from streamrec.config import StreamrecConfig
from streamrec.consumers.native_runner import ConsumerRunner
from streamrec.events import Event
from streamrec.producer import publish
from tests.integration.conftest import read_committed
from tests.integration.consumers.test_placement import split_users

Row = tuple[bytes | None, bytes | None, int]  # key, value, record timestamp


async def _read(bootstrap: str, topic: str, partitions: int, want: int) -> list[Row]:
    """Up to ``want`` records from the beginning (the embedded broker's end offsets are
    unreliable, so it reads until it has them, or until it stops getting any).
    """
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


async def _send(bootstrap: str, topic: str, events: list[Event]) -> None:
    """Publish as an application on aiokafka would: keyed by user, stamped with the event time."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for e in events:
            await producer.send_and_wait(topic, e.to_json(), key=e.user_id.encode(), timestamp_ms=e.ts)
    finally:
        await producer.stop()


def test_an_impression_published_by_streamrec_is_labelled_by_its_click_published_by_aiokafka(
    pipeline_config, topic_reader
) -> None:
    """A feed logs its impressions through streamrec's producer and its clicks from another
    service on aiokafka, both keyed by user: the click lands in its impression's partition, so
    the join labels the impression (one positive sample), not the click on its own.
    """
    cfg: StreamrecConfig = pipeline_config(consumer={
        "labels": "join", "label_window_ms": 600_000, "allowed_lateness_ms": 60_000,
    })
    (user,), ts = split_users(1, cfg.kafka.partitions), 1_700_000_000_000
    publish([Event("imp-1", user, "i1", "c1", "impression", ts)], cfg.kafka)
    asyncio.run(_send(cfg.kafka.bootstrap_servers, cfg.kafka.events_topic,
                      [Event("clk-1", user, "i1", "c1", "click", ts + 5_000)]))
    ConsumerRunner(cfg).run()
    samples = [orjson.loads(m.value()) for m in topic_reader(cfg.kafka.samples_topic)]
    assert {s["sample_id"]: s["label"] for s in samples} == {"imp-1": 1}
