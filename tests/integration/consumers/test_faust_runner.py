"""The Faust runner on the real broker and Redis: the consumer contract where its guarantees
allow (every valid event's samples, bad events dead-lettered with reasons, offsets kept), and
what differs from the native runner (at-least-once: a batch whose agent raised is redone at
the next start, its samples possibly twice). Data: the package's generated click stream.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson
import pytest

from streamrec import faults
from streamrec.config import KafkaConfig, RedisStoreConfig, StreamrecConfig
from streamrec.consumers.native_runner import BatchReport
from streamrec.consumers.processor import SampleBuilder
from streamrec.events import Event
from streamrec.featurestore.memory import MemoryFeatureStore
from streamrec.kafka.records import Partition, Record
from tests.integration.conftest import app_producer
from tests.integration.consumers.test_runner import MALFORMED, assert_sequences_complete, config, send

faust_runner = pytest.importorskip(
    "streamrec.consumers.faust_runner", reason="faust-streaming is not installed (pip install '.[faust]')"
)


def clean_run_samples(cfg: StreamrecConfig, events: Sequence[Event]) -> dict[str, dict[str, object]]:
    """What a clean run of the consumers' logic emits for ``events`` (one batch, in memory)."""
    builder = SampleBuilder(cfg.consumer, MemoryFeatureStore(cfg.model.sequence_length))
    records = [Record(e.to_json(), i, key=e.user_id.encode(), timestamp=e.ts) for i, e in enumerate(events)]
    return {s.sample_id: orjson.loads(s.to_json()) for s in builder.process(records).samples}


@pytest.fixture
def events(clicks: list[Event]) -> list[Event]:
    return clicks[:1500]


def test_the_faust_runner_emits_every_valid_events_samples_and_dead_letters_the_rest(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str, events: list[Event],
    topic_reader,
) -> None:
    cfg = config(kafka_config, store_config, unique_name)
    producer = app_producer(kafka_config)
    bad_every = len(events) // len(MALFORMED)
    for i, event in enumerate(events):
        producer.produce(kafka_config.events_topic, key=event.user_id.encode(), value=event.to_json(),
                         timestamp=event.ts)
        if i % bad_every == 0 and i // bad_every < len(MALFORMED):
            producer.produce(kafka_config.events_topic, key=b"1", value=MALFORMED[i // bad_every][0],
                             headers=[("trace", b"t")])
    producer.produce(kafka_config.events_topic, key=b"1", value=None)  # a tombstone
    assert producer.flush(10) == 0

    stats = faust_runner.FaustRunner(cfg).run()

    assert stats.events == len(events) and stats.failed == 0
    assert stats.dead == len(MALFORMED) + 1
    letters = topic_reader(kafka_config.dlq_topic)
    assert len(letters) == stats.dead
    heads = [dict(m.headers() or []) for m in letters]
    reasons = [h["streamrec.reason"].decode() for h in heads]
    for _, expected in MALFORMED:
        assert sum(expected in r for r in reasons) == 1, (expected, reasons)
    assert any("empty record" in r for r in reasons)
    for letter, head in zip(letters, heads, strict=True):
        assert letter.key() == b"1" and head["streamrec.topic"] == kafka_config.events_topic.encode()
        assert int(head["streamrec.offset"]) >= 0
        assert letter.value() is None or head.get("trace") == b"t"  # the record's own headers kept

    assert_sequences_complete(store_config, cfg, events)
    messages = topic_reader(kafka_config.samples_topic)
    emitted = [orjson.loads(m.value()) for m in messages]
    assert len(emitted) == stats.samples
    ids = [s["sample_id"] for s in emitted]
    assert len(ids) == len(set(ids)), "a sample was emitted twice"
    # Positives and their point-in-time histories are exactly a clean native run's; negatives
    # depend on the order the pools saw the stream in (no event-time alignment under Faust).
    clean = clean_run_samples(cfg, events)
    positives = {i: s for i, s in emitted_by_id(emitted).items() if "~n" not in i}
    assert positives == {i: s for i, s in clean.items() if "~n" not in i}
    for sample in emitted:
        if "~n" in sample["sample_id"]:
            own = positives[sample["sample_id"].split("~n")[0]]
            assert sample["label"] == 0 and sample["seq_items"] == own["seq_items"]
    for message, sample in zip(messages, emitted, strict=True):
        assert message.key() == sample["user_id"].encode() and message.timestamp()[1] == sample["ts"]

    again = faust_runner.FaustRunner(cfg).run()  # the offsets were committed: nothing redone
    assert again.events == 0 and again.batches == 0


def emitted_by_id(samples: list[dict[str, object]]) -> dict[str, dict[str, object]]:
    return {str(s["sample_id"]): s for s in samples}


def test_a_batch_whose_agent_raised_is_redone_at_the_next_start(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str,
    events: list[Event], topic_reader, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The native runner's twin, ``test_a_crash_mid_batch_loses_and_duplicates_nothing``.

    Faust's ``take_events`` acks a batch on the way out even when the agent raised, and its
    offsets were then committed: the batch was skipped for good, its samples lost (the docs
    called that at-least-once). The failed batch's messages are held now (a reference Faust's
    ack does not release), so no offset is committed past them and the next start redoes it.
    """
    cfg = config(kafka_config, store_config, unique_name)
    send(kafka_config, events)

    faults.reset()
    monkeypatch.setenv(faults.ENV, "consumer.after_store:2")  # the second batch dies after Redis
    first = faust_runner.FaustRunner(cfg)
    with pytest.raises(faults.InjectedFault):
        first.run()
    assert first.stats.batches == 1 and first.stats.failed > 0
    monkeypatch.delenv(faults.ENV)
    second = faust_runner.FaustRunner(cfg).run()

    # The failed batch, and whatever came behind it, is read again: nothing skipped.
    assert first.stats.events + second.events >= len(events)
    assert second.events >= len(events) - first.stats.events
    ids = [orjson.loads(m.value())["sample_id"] for m in topic_reader(kafka_config.samples_topic)]
    positives = {e.event_id for e in events if e.action == "pv"}
    assert {i for i in ids if "~n" not in i} == positives  # none lost
    # The batch's Redis effect happened before the fault: the redo is judged a redo, the
    # sequences complete, each event once.
    assert_sequences_complete(store_config, cfg, events)
    again = faust_runner.FaustRunner(cfg).run()  # committed past everything now
    assert again.events == 0


def test_the_faust_runner_reports_only_the_events_topics_partitions(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str, events: list[Event]
) -> None:
    """Found by the metrics tour: Faust also assigns its leader topic's partition, so
    ``streamrec_consumer_assigned_partitions`` read 5 for a topic of 4.
    """
    cfg = config(kafka_config, store_config, unique_name)
    send(kafka_config, events[:100])
    reports: list[BatchReport] = []
    runner = faust_runner.FaustRunner(cfg, on_batch=reports.append)
    runner.run()
    expected = [Partition(kafka_config.events_topic, p) for p in range(kafka_config.partitions)]
    assert reports and all(report.partitions == expected for report in reports)
