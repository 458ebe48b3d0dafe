"""The consumer benchmark's ceilings on a real broker: the bare consume reads every record
once, and says so rather than hang when records are missing; the forwarding floor sends one
sample of each event (their clock: ``tests/unit/bench``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest

from streamrec.config import KafkaConfig
from streamrec.events import Event
from streamrec.kafka.clients import make_producer
from streamrec.producer import publish

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from consumer_throughput import bare_consume, forward_consume  # noqa: E402  (bench/ is a folder of scripts)


def test_the_bare_consume_reads_the_records_and_stops_at_the_last(kafka_config: KafkaConfig) -> None:
    total = 3_000
    producer = make_producer(kafka_config)
    for i in range(total):
        producer.produce(kafka_config.events_topic, value=b"{}", key=str(i).encode())
    assert producer.flush(10) == 0
    assert bare_consume(kafka_config.bootstrap_servers, kafka_config.events_topic,
                        kafka_config.partitions, total, batch_size=500) > 0
    with pytest.raises(TimeoutError, match=f"fewer than {total + 1} there"):
        bare_consume(kafka_config.bootstrap_servers, kafka_config.events_topic,
                     kafka_config.partitions, total + 1, batch_size=500, idle_s=2.0)


def test_the_forwarding_floor_sends_one_sample_of_each_event(kafka_config: KafkaConfig, topic_reader) -> None:
    events = [Event(f"e{i}", f"u{i % 50}", f"i{i}", "c", "pv", 1_700_000_000_000 + i) for i in range(2_000)]
    publish(events, kafka_config)
    assert forward_consume(kafka_config, len(events), batch_size=500) > 0
    samples = [orjson.loads(m.value()) for m in topic_reader(kafka_config.samples_topic)]
    assert sorted(s["sample_id"] for s in samples) == sorted(e.event_id for e in events)
