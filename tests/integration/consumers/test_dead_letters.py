"""``streamrec consumers dead-letters`` on the real broker and Redis: what the consumers
dead-lettered, counted by the reasons of their metric, its values written to fix and publish
again with ``streamrec produce`` (which then yields samples), and the pipeline left as it was.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Sequence

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition

from streamrec import deadletter_reader
from streamrec.config import KafkaConfig, RedisStoreConfig, StreamrecConfig
from streamrec.consumers.native_runner import ConsumerRunner
from streamrec.deadletter_reader import Reading, survey
from streamrec.deadletters import DeadLetter
from streamrec.events import Event
from streamrec.kafka.records import Record
from streamrec.learner.intake import DeadLetterWriter
from tests.integration.conftest import app_producer
from tests.integration.test_cli_flow import services_env


def streamrec(args: Sequence[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamrec", *args], env=env, capture_output=True, text=True, timeout=120,
        check=False,
    )


def committed(cfg: StreamrecConfig) -> list[tuple[int, int]]:
    """The consumers' group's committed offsets on the events topic."""
    consumer = Consumer({"bootstrap.servers": cfg.kafka.bootstrap_servers, "group.id": cfg.consumer.group_id})
    try:
        parts = [TopicPartition(cfg.kafka.events_topic, p) for p in range(cfg.kafka.partitions)]
        return [(tp.partition, tp.offset) for tp in consumer.committed(parts, timeout=10)]
    finally:
        consumer.close()


def test_an_operator_reads_the_dead_letters_fixes_them_and_publishes_them_again(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str, clicks: list[Event],
    topic_reader, tmp_path,
) -> None:
    cfg = StreamrecConfig.model_validate({
        "kafka": kafka_config, "store": store_config,
        "consumer": {"group_id": f"c-{unique_name}", "stop_when_idle_s": 3.0},
    })
    events = clicks[:600]
    last_ts = max(e.ts for e in events)
    good = {"item_id": "i-fixed", "category_id": "c1", "action": "pv"}
    # a valid event keyed by another user's id, and one a year ahead of now: both fixable
    wrong_key = orjson.dumps({"event_id": "fix-1", "user_id": events[0].user_id, "ts": last_ts, **good})
    ahead = int(time.time() * 1000) + 365 * 86_400_000
    future = orjson.dumps({"event_id": "fix-2", "user_id": events[1].user_id, "ts": ahead, **good})
    bad: list[tuple[bytes | None, bytes | None]] = [
        (b"{not json", b"1"), (b'{"event_id": "x"}', b"1"), (wrong_key, b"someone-else"), (future, None),
        (b"\x01\x02\xff binary", b"1"), (None, b"1"), (b"{also not\njson", b"1"),
    ]
    producer = app_producer(kafka_config)
    for event in events:
        producer.produce(kafka_config.events_topic, key=event.user_id.encode(), value=event.to_json())
    for value, key in bad:
        producer.produce(kafka_config.events_topic, key=key if key is not None else _key(value), value=value)
    assert producer.flush(10) == 0
    stats = ConsumerRunner(cfg).run()
    assert stats.dead == len(bad)
    env = services_env(kafka_config, store_config, unique_name)
    offsets = committed(cfg)

    started = time.monotonic()
    out = streamrec(["consumers", "dead-letters"], env)
    seconds = time.monotonic() - started
    assert out.returncode == 0, out.stderr
    assert f"7 dead letters in {kafka_config.dlq_topic}" in out.stdout
    counts = {line.split()[1]: int(line.split()[0]) for line in out.stdout.splitlines()
              if line[:8].strip().isdigit()}
    assert counts == {"not_json": 3, "missing_field": 1, "wrong_key": 1, "future_timestamp": 1,
                      "null_value": 1}, out.stdout
    assert f"{kafka_config.events_topic}[" in out.stdout and "{not json" in out.stdout
    assert "{also not\\njson" in out.stdout  # a value on one line
    assert seconds < 30, seconds  # it ends at the topic's end, not at a timeout

    doc = json.loads(streamrec(["consumers", "dead-letters", "--json", "--examples", "1"], env).stdout)
    assert doc["dead_letters"] == 7 and doc["by_reason"] == counts and doc["duplicates"] == 0
    example = doc["examples"]["wrong_key"][0]
    assert example["topic"] == kafka_config.events_topic and example["offset"] >= 0
    assert len(doc["examples"]["not_json"]) == 1 and doc["stopped_short"] == {}

    fixed = tmp_path / "dead.jsonl"
    out = streamrec(["consumers", "dead-letters", "--write", str(fixed)], env)
    assert out.returncode == 0, out.stderr
    assert f"wrote 4 values to {fixed}" in out.stdout
    assert "left out 3: null (tombstones): 1; not text (not UTF-8, or control characters): 1; text over " \
        "several lines, not JSON: 1" in out.stdout
    lines = fixed.read_bytes().splitlines()
    assert sorted(lines) == sorted([b"{not json", b'{"event_id": "x"}', wrong_key, future])
    assert committed(cfg) == offsets  # the command never moved the consumers' group

    # the operator keeps the fixable two, the future one's time mended, and publishes them again
    mended = [line for line in lines if b"fix-" in line]
    mended = [orjson.dumps({**orjson.loads(x), "ts": last_ts}) for x in mended]
    fixed.write_bytes(b"\n".join(mended) + b"\n")
    out = streamrec(["produce", str(fixed)], env)
    assert out.returncode == 0 and "published 2 events" in out.stdout, out.stderr
    again = ConsumerRunner(cfg).run()
    assert again.events == 2 and again.dead == 0
    ids = {orjson.loads(m.value())["sample_id"] for m in topic_reader(kafka_config.samples_topic)}
    assert {"fix-1", "fix-2"} <= ids


def _key(value: bytes | None) -> bytes:
    return orjson.loads(value)["user_id"].encode() if value else b"1"


def test_an_empty_dead_letter_topic_says_so_and_a_missing_one_is_an_error(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str,
) -> None:
    env = services_env(kafka_config, store_config, unique_name)
    out = streamrec(["consumers", "dead-letters"], env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"no dead letters in {kafka_config.dlq_topic}"

    out = streamrec(["consumers", "dead-letters", "--dlq-topic", f"missing-{unique_name}"], env)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"missing-{unique_name} does not exist" in lines[0], out.stderr


def test_the_learners_dead_letters_by_time_and_count_and_their_duplicates(kafka_config: KafkaConfig) -> None:
    writer = DeadLetterWriter(kafka_config, 1 << 20)
    ts = 1_700_000_000_000
    letters = [
        DeadLetter.of(Record(b"{bad", n, topic="samples", partition=0, timestamp=ts + n * 1000),
                      "not valid JSON: unexpected end")
        for n in range(5)
    ]
    writer.write([*letters, letters[4]])  # the last again, as a learner restarted before its positions

    found = survey(kafka_config, Reading(kafka_config.samples_dlq_topic))
    assert found.summary.letters == 6 and found.summary.duplicates == 1
    assert found.summary.doc()["by_reason"] == {"not_json": 5} and found.short == {}
    last = survey(kafka_config, Reading(kafka_config.samples_dlq_topic, limit=2)).summary
    assert last.letters == 2 and last.first_ms == ts + 4000  # the letter and its duplicate
    since = survey(kafka_config, Reading(kafka_config.samples_dlq_topic, since_ms=ts + 3000)).summary
    assert since.letters == 3 and since.first_ms == ts + 3000
    later = survey(kafka_config, Reading(kafka_config.samples_dlq_topic, since_ms=ts + 10_000)).summary
    assert later.letters == 0
    late = survey(kafka_config, Reading(kafka_config.samples_dlq_topic, kinds=frozenset({"late"})))
    assert late.summary.letters == 0
    both = frozenset({"late", "not_json"})
    kinds = survey(kafka_config, Reading(kafka_config.samples_dlq_topic, kinds=both))
    assert kinds.summary.letters == 6



def test_the_last_n_are_the_last_dead_lettered_not_the_newest_record_times(kafka_config: KafkaConfig) -> None:
    """Found by the consumers tour: ``--limit N`` kept the newest N by record time, which a
    dead letter keeps from its failed record, so an old event dead-lettered a moment ago (a
    replay, a producer's backlog) was left out of "the last N" for letters written long before.
    """
    writer = DeadLetterWriter(kafka_config, 1 << 20)
    ts = 1_700_000_000_000
    for n in range(8):  # each newer letter of an older record, one write (batch) after another
        record = Record(b"{bad", n, key=f"user-{n}".encode(), topic="samples", partition=0,
                        timestamp=ts - n * 60_000)
        writer.write([DeadLetter.of(record, "not valid JSON: unexpected end")])
        time.sleep(0.01)
    whole = Reading(kafka_config.samples_dlq_topic)
    every = list(deadletter_reader.DeadLetterReader(kafka_config, whole).letters())
    assert len({letter.at.partition for letter in every}) > 1  # the letters span partitions

    reading = Reading(kafka_config.samples_dlq_topic, limit=3)
    last = list(deadletter_reader.DeadLetterReader(kafka_config, reading).letters())
    assert [letter.source.offset for letter in last if letter.source] == [5, 6, 7]  # in the order written
    summary = survey(kafka_config, reading).summary
    assert summary.letters == 3 and summary.first_ms == ts - 7 * 60_000

class _Inflated:
    """A consumer whose high-water marks are 5 past the real ones (of a partition with records)."""

    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer

    def __getattr__(self, name: str) -> object:
        return getattr(self._consumer, name)

    def get_watermark_offsets(self, tp: TopicPartition, **kw: object) -> tuple[int, int]:
        low, high = self._consumer.get_watermark_offsets(tp, **kw)  # type: ignore[arg-type]  # as given
        return low, high + 5 if high else high


def test_reading_ends_at_the_idle_time_when_the_end_is_never_reached(
    kafka_config: KafkaConfig, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A high-water mark past what the broker hands out (the embedded broker's can be), and no
    end-of-partition event: the reading stops after the idle time and says where.
    """
    writer = DeadLetterWriter(kafka_config, 1 << 20)
    writer.write([DeadLetter.of(Record(b"{bad", 0, topic="events"), "not valid JSON")])
    make = deadletter_reader.make_consumer
    monkeypatch.setattr(deadletter_reader, "make_consumer", lambda *a, **kw: _Inflated(make(*a, **kw)))
    no_eof = kafka_config.model_copy(update={"client": {"enable.partition.eof": False}})

    started = time.monotonic()
    found = survey(no_eof, Reading(kafka_config.samples_dlq_topic, idle_s=0.5))
    assert found.summary.letters == 1
    assert time.monotonic() - started < 10
    ((position, end),) = found.short.values()
    assert end == position + 5
