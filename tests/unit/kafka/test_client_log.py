"""librdkafka's repeated lines during a broker outage: the first of each kind a window, then a count.

Found from outside: `streamrec consumers run` with its broker killed logged ~20 ERROR lines a
second (557 in 30 s), every one "Connect to ipv4#... failed: Connection refused (after 0ms in
state CONNECT)" from the same client: librdkafka's own default, the same with a bare
confluent-kafka consumer (195 lines in 10 s).
"""

from __future__ import annotations

import logging
import time

import pytest
from confluent_kafka import Consumer

from streamrec.config import KafkaConfig
from streamrec.kafka.clients import client_logger, consumer_config
from streamrec.local.ports import free_port
from streamrec.logs import RepeatedLines

_REFUSED = (
    "FAIL [rdkafka#consumer-3] [thrd:127.0.0.1:{port}/bootstrap]: 127.0.0.1:{port}/bootstrap: Connect to "
    "ipv4#127.0.0.1:{port} failed: Connection refused (after {ms}ms in state CONNECT)"
)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _record(message: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord("streamrec.kafka.client", level, __file__, 1, message, None, None)


def test_like_lines_pass_once_a_window_and_the_next_one_counts_the_rest() -> None:
    clock = _Clock()
    lines = RepeatedLines(window_s=30.0, clock=clock)
    passed = []
    for i in range(600):  # 30 s at 20 a second, the time in each line changing
        record = _record(_REFUSED.format(port=9092, ms=i % 3))
        if lines.filter(record):
            passed.append(record.getMessage())
        clock.now += 0.05
    assert passed == [_REFUSED.format(port=9092, ms=0)]
    clock.now = 130.0  # the window's end
    record = _record(_REFUSED.format(port=9092, ms=1))
    assert lines.filter(record)
    assert record.getMessage().endswith("(599 more like it in the last 30 s not shown)")


def test_other_lines_pass_other_brokers_and_levels_apart() -> None:
    lines = RepeatedLines(window_s=30.0, clock=_Clock())
    assert lines.filter(_record(_REFUSED.format(port=9092, ms=0)))
    assert lines.filter(_record(_REFUSED.format(port=9093, ms=0)))  # another broker
    assert lines.filter(_record(_REFUSED.format(port=9092, ms=0), logging.WARNING))
    assert lines.filter(_record("SESSTMOUT [rdkafka#consumer-3] [thrd:main]: Consumer group session timeout"))
    assert not lines.filter(_record(_REFUSED.format(port=9093, ms=7)))


def test_what_it_remembers_is_bounded() -> None:
    clock = _Clock()
    lines = RepeatedLines(window_s=30.0, clock=clock, remember=100)
    for port in range(1000):
        assert lines.filter(_record(_REFUSED.format(port=port, ms=0)))
        clock.now += 0.001
    assert len(lines) <= 100


def test_a_real_client_with_its_broker_down_logs_a_few_lines_not_twenty_a_second(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()  # nothing listens there: every connection is refused
    cfg = KafkaConfig(bootstrap_servers=f"127.0.0.1:{port}")
    consumer = Consumer(consumer_config(cfg, "g"))
    consumer.subscribe(["t"])
    with caplog.at_level(logging.DEBUG, logger=client_logger.name):
        start = time.monotonic()
        while time.monotonic() - start < 3.0:
            consumer.consume(100, 0.2)
        consumer.close()
    refused = [
        r for r in caplog.records if r.name == client_logger.name and "Connection refused" in r.getMessage()
    ]
    assert 1 <= len(refused) <= 2, [r.getMessage() for r in refused]  # ~60 before
