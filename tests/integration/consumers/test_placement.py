"""Records that break the events topic's partitioning, published as other clients publish them:
on librdkafka's default partitioner (CRC32), and without a key (as ``kcat -P`` without ``-K``).
They go to the dead-letter topic whole, with what to change, and stay out of the store; a
topic written consistently by another partitioner is read by naming it.
"""

from __future__ import annotations

import logging
import zlib

import orjson
import pytest
from aiokafka.partitioner import murmur2
from confluent_kafka import Producer

from streamrec.config import RedisStoreConfig, StreamrecConfig
from streamrec.consumers.native_runner import ConsumerRunner
from streamrec.consumers.rebuild import rebuild_store
from streamrec.errors import PartitionerMismatch
from streamrec.events import Event
from streamrec.featurestore import RedisFeatureStore
from streamrec.producer import publish

T0 = 1_511_658_000_000


def split_users(count: int, partitions: int) -> list[str]:
    """Users that librdkafka's default partitioner (CRC32) and the Java client's (murmur2, as
    aiokafka, kafka-python, Kafka Streams and Connect) put in different partitions, by the
    reference implementations (zlib's, aiokafka's), not streamrec's.
    """
    users = (f"s{k}" for k in range(10_000))
    return [
        u for u in users
        if zlib.crc32(u.encode()) % partitions != (murmur2(u.encode()) & 0x7FFFFFFF) % partitions
    ][:count]


def default_producer(cfg: StreamrecConfig) -> Producer:
    """confluent-kafka as it comes: librdkafka's default partitioner, CRC32 of the key."""
    return Producer({"bootstrap.servers": cfg.kafka.bootstrap_servers})


def test_records_on_another_partitioner_or_without_a_key_are_dead_lettered_with_what_to_change(
    pipeline_config, store_config: RedisStoreConfig, clicks: list[Event], topic_reader
) -> None:
    cfg: StreamrecConfig = pipeline_config()
    events = clicks[:600]
    publish(events, cfg.kafka)  # streamrec's producer: murmur2, as the consumers check
    strays = [Event(f"x{k}", user, "i1", "c1", "pv", T0 + k) for k, user in
              enumerate(split_users(3, cfg.kafka.partitions))]
    unkeyed = Event("y0", "u-unkeyed", "i2", "c2", "pv", T0)
    producer = default_producer(cfg)
    for e in strays:
        producer.produce(cfg.kafka.events_topic, e.to_json(), key=e.user_id.encode(), timestamp=e.ts)
    producer.produce(cfg.kafka.events_topic, unkeyed.to_json(), timestamp=unkeyed.ts)
    assert producer.flush(10) == 0

    stats = ConsumerRunner(cfg).run()

    assert stats.events == len(events) and stats.dead == len(strays) + 1
    letters = {orjson.loads(m.value())["event_id"]: m for m in topic_reader(cfg.kafka.dlq_topic)}
    assert set(letters) == {e.event_id for e in strays} | {"y0"}
    for e in strays:  # whole, and the reason says where the record belongs and what to set
        letter = letters[e.event_id]
        reason = dict(letter.headers() or [])["streamrec.reason"].decode()
        assert letter.value() == e.to_json() and letter.key() == e.user_id.encode()
        assert f"user '{e.user_id}' belongs in {cfg.kafka.events_topic}[" in reason
        assert "partitioner=murmur2_random" in reason
    assert dict(letters["y0"].headers() or [])["streamrec.reason"].startswith(b"record has no key")
    for e in strays:  # each is where crc32 puts it, and says so; a few misplaced records stop nothing
        assert "PARTITIONER=crc32 if every producer uses it" in reason_of(letters[e.event_id])
    store = RedisFeatureStore(store_config, cfg.model.sequence_length)
    assert all(store.sequence(e.user_id) == [] for e in [*strays, unkeyed])

    # a rebuilt store leaves them out too, as the consumers did
    rebuilt = rebuild_store(cfg, force=True)
    assert rebuilt.events == len(events) and rebuilt.invalid == len(strays) + 1
    assert all(store.sequence(e.user_id) == [] for e in [*strays, unkeyed])


def reason_of(letter) -> str:  # noqa: ANN001 - a confluent-kafka Message
    return dict(letter.headers() or [])["streamrec.reason"].decode()


def test_a_topic_written_by_librdkafkas_default_partitioner_read_by_murmur2_stops_naming_the_setting(
    pipeline_config, clicks: list[Event], topic_reader, caplog: pytest.LogCaptureFixture
) -> None:
    # before: 7 of 8 events dead-lettered (2000 events over 8 partitions, measured from outside),
    # the consumer trained on the rest and stopped idle with exit status 0
    cfg: StreamrecConfig = pipeline_config()
    events = clicks[:2000]
    producer = default_producer(cfg)
    for e in events:
        producer.produce(cfg.kafka.events_topic, e.to_json(), key=e.user_id.encode(), timestamp=e.ts)
    assert producer.flush(10) == 0
    runner = ConsumerRunner(cfg)
    with caplog.at_level(logging.WARNING, logger="streamrec"), pytest.raises(PartitionerMismatch) as raised:
        runner.run()
    assert "STREAMREC_KAFKA__PARTITIONER=crc32" in str(raised.value)
    hints = [r for r in caplog.records if "set STREAMREC_KAFKA__PARTITIONER=crc32" in r.getMessage()]
    assert len(hints) == 1
    # the batch that showed it was not processed: nothing stored or sent from it
    assert runner.stats.events < len(events) // 4 and runner.stats.dead < len(events) // 2


def test_a_topic_written_by_librdkafkas_default_partitioner_is_read_by_naming_it(
    pipeline_config, clicks: list[Event], topic_reader
) -> None:
    cfg: StreamrecConfig = pipeline_config()
    cfg = cfg.model_copy(update={"kafka": cfg.kafka.model_copy(update={"partitioner": "crc32"})})
    events = clicks[:600]
    producer = default_producer(cfg)
    for e in events:
        producer.produce(cfg.kafka.events_topic, e.to_json(), key=e.user_id.encode(), timestamp=e.ts)
    assert producer.flush(10) == 0
    stats = ConsumerRunner(cfg).run()
    assert stats.events == len(events) and stats.dead == 0
    assert not topic_reader(cfg.kafka.dlq_topic)
