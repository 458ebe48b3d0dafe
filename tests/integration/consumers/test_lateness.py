"""Late events on the real broker and Redis: the native runner dead-letters them (reason
``late event``) or keeps them in their sequences without samples, decides the same when it
redoes an aborted batch, and reports records whose timestamp is not the event time.
Data: hand-made clicks of 20 users on one partition.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Any

import orjson
import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from streamrec.config import KafkaConfig, RedisStoreConfig, StreamrecConfig
from streamrec.consumers.native_runner import BatchReport, ConsumerRunner
from streamrec.events import Event
from streamrec.featurestore import RedisFeatureStore
from streamrec.observability.consumer import ConsumerMetrics

ALLOWED_MS = 10_000
N = 600  # two batches of 300 and more


def stream() -> tuple[list[Event], Event, Event]:
    """Clicks a second apart; one 250 s behind the newest (late) and one 5 s behind (not)."""
    base = int(time.time() * 1000) - 86_400_000  # a day ago: within every clock check
    events = [Event(f"e{i}", f"u{i % 20}", f"i{i % 97}", "c", "pv", base + i * 1000) for i in range(N)]
    late = Event("late", "u3", "i-late", "c", "pv", base + 99 * 1000)  # e349 is the newest before it
    slightly = Event("slightly", "u4", "i-slight", "c", "pv", base + 340 * 1000)  # after e345
    events[350:350] = [late]
    events[346:346] = [slightly]
    return events, late, slightly


def config(kafka: KafkaConfig, store_cfg: RedisStoreConfig, unique: str, policy: str) -> StreamrecConfig:
    consumer = {"group_id": f"c-{unique}", "stop_when_idle_s": 3.0, "batch_size": 300, "negatives": 1,
                "allowed_lateness_ms": ALLOWED_MS, "late_events": policy, "metrics_port": 0}
    kafka = kafka.model_copy(update={"partitioner": None})  # every record on partition 0, by hand
    return StreamrecConfig.model_validate({"kafka": kafka, "store": store_cfg, "consumer": consumer})


def produce(kafka: KafkaConfig, events: list[Event], unstamped: Collection[str] = ()) -> None:
    """All on partition 0, stamped with their event time except ``unstamped`` ones (as kcat
    sends them: the broker's clock).
    """
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for event in events:
        stamp: dict[str, Any] = {} if event.event_id in unstamped else {"timestamp": event.ts}
        key = event.user_id.encode()
        producer.produce(kafka.events_topic, event.to_json(), key=key, partition=0, **stamp)
    assert producer.flush(10) == 0


def abort_the_late_batch_once(runner: ConsumerRunner) -> list[int]:
    """Make the transaction of the batch holding a late event abort once, after its records
    were produced into it (as when the broker aborts it): the runner redoes the batch.
    """
    aborted: list[int] = []
    fill = runner._fill

    def failing_fill(producer: Any, *, result: Any) -> None:
        fill(producer, result=result)
        if result.late and not aborted:
            aborted.append(result.events)
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "injected: transaction aborted"))

    runner._fill = failing_fill  # type: ignore[method-assign]  # the fault is injected at the instance
    return aborted


@pytest.mark.parametrize("policy", ["dead_letter", "sequence_only"])
def test_a_late_event_is_judged_once_and_the_same_in_a_redone_batch(
    policy: str, kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str,
    topic_reader, aborts_unsent: None,
) -> None:
    events, late, slightly = stream()
    produce(kafka_config, events)
    cfg = config(kafka_config, store_config, unique_name, policy)
    metrics = ConsumerMetrics()
    reports: list[BatchReport] = []

    def on_batch(report: BatchReport) -> None:
        reports.append(report)
        metrics.observe_batch(report)

    runner = ConsumerRunner(cfg, on_batch=on_batch)
    # The late event is 200 s and more behind e299 too: late whatever the batch boundaries.
    aborted = abort_the_late_batch_once(runner)
    stats = runner.run()

    assert aborted, "no transaction was aborted"
    assert stats.retries >= 1 and stats.events == len(events)
    assert stats.late == 1 and stats.timestamp_mismatches == 0
    assert metrics.registry.get_sample_value("streamrec_consumer_late_events_total") == 1
    ids = [orjson.loads(m.value())["sample_id"] for m in topic_reader(kafka_config.samples_topic)]
    assert len(ids) == len(set(ids)), "a sample was emitted twice"
    assert {i for i in ids if "~n" not in i} == {e.event_id for e in events} - {late.event_id}
    assert slightly.event_id in ids  # 5 s behind: within the allowed lateness

    store = RedisFeatureStore(store_config, cfg.model.sequence_length)
    in_sequence = late.event_id in {b.event_id for b in store.sequence(late.user_id)}
    letters = topic_reader(kafka_config.dlq_topic)
    dead_kind = metrics.registry.get_sample_value("streamrec_consumer_dead_letters_total", {"reason": "late"})
    if policy == "dead_letter":
        (letter,) = letters
        headers = dict(letter.headers() or [])
        reason = headers["streamrec.reason"].decode()
        assert reason.startswith(f"late event: ts={late.ts} is 250000 ms behind"), reason
        assert letter.value() == late.to_json() and letter.timestamp()[1] == late.ts
        assert stats.dead == 1 and dead_kind == 1 and not in_sequence
    else:
        assert letters == [] and stats.dead == 0 and dead_kind == 0
        assert in_sequence  # real behaviour: later histories hold it


def test_record_timestamps_that_are_not_event_times_are_counted(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A producer that leaves the record timestamp at the send time (kcat, for one): the
    events are processed as ever, and the mismatch is counted and warned about.
    """
    events, _, _ = stream()
    events = events[:100]
    unstamped = {e.event_id for e in events[::10]}
    produce(kafka_config, events, unstamped)
    cfg = config(kafka_config, store_config, unique_name, "sequence_only")
    with caplog.at_level("WARNING", logger="streamrec.consumers.processor"):
        stats = ConsumerRunner(cfg).run()
    assert stats.events == 100 and stats.timestamp_mismatches == len(unstamped) == 10
    warnings = [r.getMessage() for r in caplog.records if "record timestamp is not" in r.getMessage()]
    assert len(warnings) == 1 and f"partition={kafka_config.events_topic}[0]" in warnings[0]
