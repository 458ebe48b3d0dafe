"""EventProducer and publish() against the real broker."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from streamrec.config import KafkaConfig
from streamrec.datasets import read_events
from streamrec.errors import DeliveryError
from streamrec.events import Event
from streamrec.kafka.clients import producer_config
from streamrec.kafka.topics import ensure_topics
from streamrec.local.ports import free_port
from streamrec.producer import EventProducer, publish
from tests.integration.conftest import PrivateService


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
    said = (r"^0 of 2 events delivered; 2 (not delivered|still unacknowledged)"
            r".*; sending them again is safe \(the consumers keep each event id once\): e-17, e-18$")
    with pytest.raises(DeliveryError, match=said):
        producer.flush(timeout_s=10)


def test_a_broker_lost_midway_is_said_with_what_was_delivered(private_broker: PrivateService) -> None:
    # noted by the replay tour: 'produce' of 100,004 events to a broker killed midway said only
    # "61114 event(s) still unacknowledged", not that the other 38,890 had been delivered
    cfg = KafkaConfig(bootstrap_servers=private_broker.address, client={"message.timeout.ms": 2000})
    ensure_topics(cfg)
    producer = EventProducer(cfg)
    for k in range(20):
        producer.send(Event(f"e-{k}", "u", "i", "c", "pv", 1_511_658_000_000 + k))
    producer.flush(timeout_s=10)
    private_broker.proc.stop()
    producer.send(Event("e-20", "u", "i", "c", "pv", 1_511_658_000_020))
    start = time.monotonic()
    with pytest.raises(DeliveryError, match=r"^20 of 21 events delivered; 1 .*: e-20$"):
        producer.flush(timeout_s=10)
    assert time.monotonic() - start < 10  # within the message timeout, not the flush's


def test_the_producer_is_idempotent(kafka_config: KafkaConfig) -> None:
    assert producer_config(kafka_config)["enable.idempotence"] is True


def test_events_repeating_an_id_are_published_and_said(
    kafka_config: KafkaConfig, caplog: pytest.LogCaptureFixture
) -> None:
    # found by the replay tour: a file with ids twice was published without a word, and the
    # consumers then dropped the resent ones and dead-lettered the reused ones
    events = [Event(f"e-{k}", "u", f"i{k}", "c", "pv", 1_511_658_000_000 + k) for k in range(6)]
    resent = events[:2]
    reused = [Event("e-5", "u", "other", "c", "pv", 1_511_658_000_005)]
    with caplog.at_level("WARNING", logger="streamrec.producer"):
        assert publish([*events, *resent, *reused], kafka_config) == 9
    assert [r.getMessage() for r in caplog.records] == [
        f"published 3 events repeating an earlier event id to {kafka_config.events_topic}: 2 resent (the "
        "same event: the consumers keep it once; e-0, e-1), 1 reused for another event (the consumers "
        "dead-letter it; e-5)"
    ]


def test_an_interrupted_publish_says_what_was_delivered(kafka_config: KafkaConfig) -> None:
    # found by the replay tour: Ctrl-C in 'produce' said "interrupted", not what had been sent
    def events() -> Iterator[Event]:
        for k in range(3):
            yield Event(f"e-{k}", "u", "i", "c", "pv", 1_511_658_000_000 + k)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as stopped:
        publish(events(), kafka_config)
    assert stopped.value.__notes__ == [
        f"3 of the 3 events sent were delivered to {kafka_config.events_topic} before it stopped; "
        "publishing them again is safe (the consumers keep each event id once)"
    ]


def test_your_data_pages_python_example_publishes_declared_features_at_their_fields(
    kafka_config: KafkaConfig, topic_reader, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/your-data.md's application example, run as written.

    Found touring as a news site: the page showed no way to send an event's declared features
    (a tier, a device, a dwell time) from Python, though `Event(features=...)` and
    `EventProducer(kafka, schema)` carry them to the fields the consumers read.
    """
    page = (Path(__file__).parents[2] / "docs" / "your-data.md").read_text()
    code = page.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.setenv("STREAMREC_KAFKA__BOOTSTRAP_SERVERS", kafka_config.bootstrap_servers)
    monkeypatch.setenv("STREAMREC_KAFKA__EVENTS_TOPIC", kafka_config.events_topic)
    monkeypatch.setenv("STREAMREC_FEATURES", orjson.dumps([  # as docs/your-features.md declares them
        {"name": "genres", "kind": "ids"}, {"name": "dwell_s", "kind": "number", "outcome": True},
        {"name": "tier", "role": "user"}, {"name": "device", "role": "context"},
    ]).decode())
    monkeypatch.chdir(Path(__file__).parent)  # no streamrec.toml here
    now_ms = int(time.time() * 1000)
    exec(compile(code, "your-data.md", "exec"), {"now_ms": now_ms})  # noqa: S102  # the page's own code
    values = [orjson.loads(m.value()) for m in topic_reader(kafka_config.events_topic)]
    featured = [v for v in values if "tier" in v]
    assert featured, values
    assert all(v["ts"] == now_ms and v["device"] == "ios" and "dwell_s" in v for v in featured), featured
