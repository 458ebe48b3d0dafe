"""The consumer benchmark's ceiling is a rate of reading, not of waiting.

Until the eighth session its bare consume was timed from before the first batch's start-up
(about 0.5 s on the embedded broker) to after a last batch call that blocked its whole 1 s
timeout for records that were not there: some 68,000 records a second whatever the machine,
against about a million read, and every "ratio to the ceiling" since was the waits'.
"""

from __future__ import annotations

import sys
from pathlib import Path

from streamrec.config import KafkaConfig
from streamrec.kafka.clients import make_producer

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from consumer_throughput import bare_consume  # noqa: E402  (bench/ is a folder of scripts)


def test_the_bare_consume_counts_no_start_up_and_no_final_timeout(kafka_config: KafkaConfig) -> None:
    total = 3_000
    producer = make_producer(kafka_config)
    for i in range(total):
        producer.produce(kafka_config.events_topic, value=b"{}", key=str(i).encode())
    assert producer.flush(10) == 0
    rate = bare_consume(kafka_config.bootstrap_servers, kafka_config.events_topic,
                        kafka_config.partitions, total, batch_size=500)
    # The old clock gave at most 3,000 / 1.5 s; reading 2,500 records takes milliseconds.
    assert rate > 20_000
