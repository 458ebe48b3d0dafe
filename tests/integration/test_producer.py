"""EventProducer and publish() against the real broker."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from streamrec.config import KafkaConfig
from streamrec.datasets import read_events
from streamrec.errors import DeliveryError
from streamrec.events import Event
from streamrec.kafka.clients import producer_config
from streamrec.local.ports import free_port
from streamrec.producer import EventProducer, publish


def test_events_arrive_keyed_by_user_with_event_time_timestamps(
    kafka_config: KafkaConfig, movielens_path: Path, topic_reader
) -> None:
    events = read_events(movielens_path, limit=500)
    with EventProducer(kafka_config) as producer:
        for event in events:
            producer.send(event)
    assert producer.delivered == 500
    records = topic_reader(kafka_config.events_topic)
    assert len(records) == 500
    by_id = {e.event_id: e for e in events}
    for msg in records:
        event = by_id[orjson.loads(msg.value())["event_id"]]
        assert msg.key() == event.user_id.encode()
        assert msg.timestamp()[1] == event.ts


def test_publish_honours_the_rate(kafka_config: KafkaConfig, movielens_path: Path) -> None:
    events = read_events(movielens_path, limit=300)
    start = time.monotonic()
    assert publish(events, kafka_config, rate=1000) == 300
    assert time.monotonic() - start >= 0.29


def test_an_unreachable_broker_is_a_delivery_error() -> None:
    cfg = KafkaConfig(
        bootstrap_servers=f"127.0.0.1:{free_port()}", client={"message.timeout.ms": 1000}
    )
    producer = EventProducer(cfg)
    producer.send(Event("e-17", "u", "i", "c", "pv", 1_511_658_000_000))
    producer.send(Event("e-18", "u", "i", "c", "pv", 1_511_658_000_000))
    with pytest.raises(DeliveryError, match=r"(not delivered|unacknowledged).*: e-17, e-18$"):
        producer.flush(timeout_s=10)


def test_the_producer_is_idempotent(kafka_config: KafkaConfig) -> None:
    assert producer_config(kafka_config)["enable.idempotence"] is True
