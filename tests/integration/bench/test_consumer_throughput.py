"""The consumer benchmark's bare consume on a real broker: it reads every record once, and
says so rather than hang when records are missing (its clock: ``tests/unit/bench``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from streamrec.config import KafkaConfig
from streamrec.kafka.clients import make_producer

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from consumer_throughput import bare_consume  # noqa: E402  (bench/ is a folder of scripts)


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
