"""``streamrec replay publish``: a dataset into Kafka at a multiple of its own event time."""

from __future__ import annotations

import time

from typer.testing import CliRunner

from streamrec.cli import app
from streamrec.config import KafkaConfig
from streamrec.datasets import load_events

SOURCE = "synthetic:events=300,users=30,items=100,duration_ms=20000,seed=5"  # 20 s of events


def test_publish_paces_events_by_their_own_time(kafka_config: KafkaConfig, topic_reader, monkeypatch) -> None:
    monkeypatch.setenv("STREAMREC_KAFKA__EVENTS_TOPIC", kafka_config.events_topic)
    events = load_events(SOURCE)
    span_s = (events[-1].ts - events[0].ts) / 1000
    start = time.monotonic()
    out = CliRunner().invoke(app, [
        "replay", "publish", SOURCE, "--speedup", "10", "--bootstrap-servers", kafka_config.bootstrap_servers,
    ])
    elapsed = time.monotonic() - start
    assert out.exit_code == 0, out.output
    assert "published 300 events" in out.output
    assert elapsed >= span_s / 10 * 0.95  # paced: not before the data's own time allows
    records = topic_reader(kafka_config.events_topic)
    assert sorted(m.timestamp()[1] for m in records) == [e.ts for e in events]
