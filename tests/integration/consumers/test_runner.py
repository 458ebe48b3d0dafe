"""The consumer runner on the real broker and Redis: bad input never crashes or vanishes,
crashes and rebalances lose and double nothing. Data: the package's generated click stream.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence

import orjson
import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, Consumer, Producer, TopicPartition

from streamrec import faults
from streamrec.config import KafkaConfig, RedisStoreConfig, StreamrecConfig
from streamrec.consumers.native_runner import ConsumerRunner, ConsumerStats
from streamrec.datasets.synthetic import ClickStreamSpec, generate_clicks
from streamrec.events import Event
from streamrec.featurestore import RedisFeatureStore
from streamrec.producer import publish
from tests.integration.conftest import app_producer


def config(kafka: KafkaConfig, store_cfg: RedisStoreConfig, unique: str) -> StreamrecConfig:
    consumer = {"group_id": f"c-{unique}", "stop_when_idle_s": 3.0, "batch_size": 300, "negatives": 1}
    return StreamrecConfig.model_validate({"kafka": kafka, "store": store_cfg, "consumer": consumer})


def hand_placed(cfg: StreamrecConfig) -> StreamrecConfig:
    """``cfg`` for records a test puts in partitions of its own choosing: their placement is
    not checked (``STREAMREC_KAFKA__PARTITIONER=null``).
    """
    return cfg.model_copy(update={"kafka": cfg.kafka.model_copy(update={"partitioner": None})})


@pytest.fixture
def events(clicks: list[Event]) -> list[Event]:
    return clicks[:1500]


def send(kafka: KafkaConfig, events: Sequence[Event]) -> None:
    """Publish as an application on confluent-kafka does (see `app_producer`)."""
    producer = app_producer(kafka)
    for event in events:
        producer.produce(kafka.events_topic, key=event.user_id.encode(), value=event.to_json())
    assert producer.flush(10) == 0


def assert_sequences_complete(
    store_cfg: RedisStoreConfig, cfg: StreamrecConfig, events: Sequence[Event]
) -> None:
    """Every valid event reached its user's sequence (up to the cap)."""
    store = RedisFeatureStore(store_cfg, cfg.model.sequence_length)
    for user, count in Counter(e.user_id for e in events).items():
        assert len(store.sequence(user)) == min(count, cfg.model.sequence_length), user


MALFORMED = [
    (b"{not json", "not valid JSON"),
    (b'{"event_id": "x1", "user_id": "1"}', "missing field"),
    (orjson.dumps({"event_id": "x2", "user_id": "1", "item_id": [1], "category_id": "2",
                   "action": "pv", "ts": 1511658000000}), "'item_id' must be"),
    (orjson.dumps({"event_id": "x3", "user_id": "1", "item_id": "1", "category_id": "2",
                   "action": "pv", "ts": 4102444800000}), "in the future"),
    (orjson.dumps({"event_id": "x4", "user_id": "1", "item_id": "1", "category_id": "2",
                   "action": "pv", "ts": 1511658000}), "looks like seconds"),
    (b'{"pad": "' + b"x" * 20_000 + b'"}', "byte limit"),
    (b"[]", "expected a JSON object"),
    # a valid event, sent under another user's key (as a producer keying by session would)
    (orjson.dumps({"event_id": "x5", "user_id": "someone-else", "item_id": "1", "category_id": "2",
                   "action": "pv", "ts": 1511658000000}), "is not the event's user_id 'someone-else'"),
]


def test_malformed_events_go_to_the_dlq_and_valid_ones_are_all_processed(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str, events: list[Event],
    topic_reader,
) -> None:
    cfg = config(kafka_config, store_config, unique_name)
    producer = app_producer(kafka_config)
    bad_every = len(events) // len(MALFORMED)
    for i, event in enumerate(events):
        producer.produce(kafka_config.events_topic, key=event.user_id.encode(), value=event.to_json())
        if i % bad_every == 0 and i // bad_every < len(MALFORMED):
            producer.produce(kafka_config.events_topic, key=b"1", value=MALFORMED[i // bad_every][0])
    producer.produce(kafka_config.events_topic, key=b"1", value=None)  # a tombstone
    assert producer.flush(10) == 0

    stats = ConsumerRunner(cfg).run()

    assert stats.events == len(events)
    assert stats.dead == len(MALFORMED) + 1
    dead = [dict(m.headers() or []) for m in topic_reader(kafka_config.dlq_topic)]
    assert len(dead) == stats.dead
    reasons = [d["streamrec.reason"].decode() for d in dead]
    for _, expected in MALFORMED:
        assert sum(expected in r for r in reasons) == 1, (expected, reasons)
    assert any("empty record" in r for r in reasons)
    for letter in dead:
        assert letter["streamrec.topic"] == kafka_config.events_topic.encode()
        assert int(letter["streamrec.offset"]) >= 0

    assert_sequences_complete(store_config, cfg, events)
    samples = topic_reader(kafka_config.samples_topic)
    assert len(samples) == stats.samples
    positives = sum(1 for e in events if e.action == "pv")
    ids = [orjson.loads(m.value())["sample_id"] for m in samples]
    assert len(set(ids)) == len(ids)
    assert sum("~n" not in i for i in ids) == positives
    for record in samples:  # keyed by user, stamped with the event time
        sample = orjson.loads(record.value())
        assert record.key() == sample["user_id"].encode()
        assert record.timestamp() == (TIMESTAMP_CREATE_TIME, sample["ts"])


@pytest.mark.parametrize("point", ["consumer.after_store", "consumer.before_commit"])
def test_a_crash_mid_batch_loses_and_duplicates_nothing(
    point: str, kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str,
    events: list[Event], topic_reader, monkeypatch: pytest.MonkeyPatch,
    aborts_unsent: None,
) -> None:
    cfg = config(kafka_config, store_config, unique_name)
    send(kafka_config, events)

    faults.reset()
    monkeypatch.setenv(faults.ENV, f"{point}:2")  # the second batch dies half-way
    first = ConsumerRunner(cfg)
    with pytest.raises(faults.InjectedFault):
        first.run()
    assert first.stats.batches == 1
    monkeypatch.delenv(faults.ENV)
    second = ConsumerRunner(cfg).run()
    assert first.stats.events + second.events == len(events)

    samples = [orjson.loads(m.value()) for m in topic_reader(kafka_config.samples_topic)]
    ids = [s["sample_id"] for s in samples]
    assert len(ids) == len(set(ids)), "a sample was emitted twice"
    positives = {e.event_id for e in events if e.action == "pv"}
    assert {i for i in ids if "~n" not in i} == positives
    assert_sequences_complete(store_config, cfg, events)


# A consumer process with the config in argv[1] (JSON); it prints its totals.
_CONSUMER = (
    "import sys\n"
    "from streamrec.config import StreamrecConfig\n"
    "from streamrec.consumers.native_runner import ConsumerRunner\n"
    "print(ConsumerRunner(StreamrecConfig.model_validate_json(sys.argv[1])).run())\n"
)


def process_state(pid: int) -> str:
    """A process's state letter from /proc: T while stopped."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def test_a_consumer_frozen_past_its_session_timeout_before_its_commit_commits_nothing_after(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str,
    events: list[Event], topic_reader,
) -> None:
    """A consumer process frozen (SIGSTOP: a VM stall, a swap storm) after a batch's Redis
    write and before its commit, for longer than its session timeout: another consumer takes
    its partitions and processes the batch itself. When the frozen one resumes, it must not
    commit the batch too (its samples twice, and its older offsets over the new owner's).
    The embedded broker does not fence the stale group member's transaction (Apache Kafka
    2.5+ does, KIP-447); the consumers' partition claims in Redis must.
    """
    cfg = config(kafka_config, store_config, unique_name)
    send(kafka_config, events)
    env = {**os.environ, faults.ENV: "consumer.after_store:2", f"{faults.ENV}_MODE": "stop"}
    frozen = subprocess.Popen(
        [sys.executable, "-c", _CONSUMER, cfg.model_dump_json()], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while process_state(frozen.pid) != "T":
            assert frozen.poll() is None, frozen.communicate()
            assert time.monotonic() < deadline, "the consumer never reached its second batch"
            time.sleep(0.05)
        taker = ConsumerRunner(cfg).run()  # joins once the frozen one's session times out
        os.kill(frozen.pid, signal.SIGCONT)
        _, err = frozen.communicate(timeout=60)
    finally:
        if frozen.poll() is None:
            os.kill(frozen.pid, signal.SIGCONT)
            frozen.kill()
    assert taker.events >= len(events) - 300  # all but the frozen one's first batch, at least

    samples = [orjson.loads(m.value()) for m in topic_reader(kafka_config.samples_topic)]
    ids = Counter(s["sample_id"] for s in samples)
    twice = sorted(i for i, n in ids.items() if n > 1)
    assert not twice, f"{len(twice)} samples emitted twice, e.g. {twice[:3]}"
    assert {i for i in ids if "~n" not in i} == {e.event_id for e in events if e.action == "pv"}
    group = Consumer({"bootstrap.servers": kafka_config.bootstrap_servers, "group.id": cfg.consumer.group_id})
    try:
        committed = group.committed(
            [TopicPartition(kafka_config.events_topic, p) for p in range(kafka_config.partitions)], 10
        )
    finally:
        group.close()
    assert sum(tp.offset for tp in committed) == len(events), "the group's offsets moved back"
    assert frozen.returncode != 0 and "claimed by another consumer" in err, err[-2000:]


def test_two_consumers_in_one_group_share_the_work_exactly_once(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str, topic_reader,
) -> None:
    # Half the events before the second one joins, half after: one consumer got through all
    # 60,000 (3 s) before a join (3 s) and the other had nothing left to share.
    clicks = generate_clicks(ClickStreamSpec(users=3_000, items=20_000, events=60_000, seed=11))
    cfg = config(kafka_config, store_config, unique_name)
    cfg = cfg.model_copy(update={"consumer": cfg.consumer.model_copy(update={"stop_when_idle_s": 5.0})})
    half = len(clicks) // 2
    send(kafka_config, clicks[:half])

    runners = [ConsumerRunner(cfg), ConsumerRunner(cfg)]
    results: list[ConsumerStats | None] = [None, None]
    threads = [
        threading.Thread(target=lambda i=i: results.__setitem__(i, runners[i].run()))
        for i in range(2)
    ]
    threads[0].start()
    deadline = time.monotonic() + 60
    while runners[0].stats.batches == 0:  # the second one joins while the first is at work
        assert time.monotonic() < deadline, "the first consumer never committed a batch"
        time.sleep(0.05)
    threads[1].start()
    while runners[1].assignments == 0 or runners[0].assignments < 2:  # the group rebalanced
        assert time.monotonic() < deadline, "the second consumer never joined"
        time.sleep(0.05)
    send(kafka_config, clicks[half:])
    for thread in threads:
        thread.join(120)
    done = [r for r in results if r is not None]
    assert len(done) == 2, "a runner failed"
    assert runners[0].assignments >= 2, "the first consumer saw no rebalance"
    assert sum(r.events for r in done) == len(clicks)
    assert all(r.events > 0 for r in done), [r.events for r in done]

    samples = [orjson.loads(m.value()) for m in topic_reader(kafka_config.samples_topic)]
    ids = [s["sample_id"] for s in samples]
    assert len(ids) == len(set(ids))
    assert {i for i in ids if "~n" not in i} == {e.event_id for e in clicks if e.action == "pv"}


def test_a_consumer_stopping_when_idle_first_drains_what_alignment_holds_back(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str
) -> None:
    """An event an hour later than its neighbour partition's is held back by alignment until
    the other partitions have been quiet for a while: no reason to call the stream idle.
    """
    cfg = hand_placed(config(kafka_config, store_config, unique_name))
    cfg = cfg.model_copy(update={"consumer": cfg.consumer.model_copy(update={"stop_when_idle_s": 1.0})})
    now = int(time.time() * 1000)
    early = Event("early", "u1", "i1", "c1", "pv", now - 2 * 3_600_000)
    late = Event("late", "u2", "i2", "c2", "pv", now - 3_600_000)
    producer = Producer({"bootstrap.servers": kafka_config.bootstrap_servers})
    for partition, event in enumerate((early, late)):
        producer.produce(kafka_config.events_topic, event.to_json(), partition=partition, timestamp=event.ts)
    assert producer.flush(10) == 0
    stats = ConsumerRunner(cfg).run()
    assert stats.events == 2


def test_oversized_and_binary_records_become_dead_letters_that_always_fit(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str,
    events: list[Event], topic_reader,
) -> None:
    """A 1 MB record and 200 KB of control bytes once made a dead letter over the broker's
    limit: every restart died on it and the valid events behind it were never processed.
    """
    cfg = config(kafka_config, store_config, unique_name)
    producer = app_producer(kafka_config, **{"message.max.bytes": 2_000_000})
    huge = b"x" * 1_000_000
    controls = b"\x01" * 200_000
    invalid_utf8 = b"\xff\xfe{\xc3\x28 not utf-8"
    bad = [(huge, b"k-huge"), (controls, b"k-ctl"), (invalid_utf8, None)]
    for i, (value, key) in enumerate(bad):
        producer.produce(
            kafka_config.events_topic, value, key=key, partition=0, timestamp=1_700_000_000_000 + i,
            headers=[("trace", f"t{i}".encode()), ("trace", b"again")],
        )
    for event in events:
        producer.produce(kafka_config.events_topic, key=event.user_id.encode(), value=event.to_json())
    assert producer.flush(10) == 0

    stats = ConsumerRunner(cfg).run()
    assert stats.events == len(events) and stats.dead == 3

    letters = sorted(topic_reader(kafka_config.dlq_topic), key=lambda m: m.timestamp()[1])
    assert len(letters) == 3
    for i, (letter, (value, key)) in enumerate(zip(letters, bad, strict=True)):
        headers = letter.headers() or []
        meta = {k: v for k, v in headers if k.startswith("streamrec.")}
        assert letter.key() == key and letter.timestamp()[1] == 1_700_000_000_000 + i
        traces = [(k, v) for k, v in headers if k == "trace"]
        assert traces == [("trace", f"t{i}".encode()), ("trace", b"again")]
        assert meta["streamrec.topic"] == kafka_config.events_topic.encode()
        assert meta["streamrec.partition"] == b"0" and meta["streamrec.offset"] == str(i).encode()
        assert b"over the" in meta["streamrec.reason"] or b"JSON" in meta["streamrec.reason"]
        assert meta["streamrec.length"] == str(len(value)).encode()
        if len(value) <= cfg.consumer.dead_letter_max_bytes:
            assert letter.value() == value and "streamrec.sha256" not in meta  # byte for byte
        else:
            assert letter.value() == value[: cfg.consumer.dead_letter_max_bytes]
            assert meta["streamrec.sha256"] == hashlib.sha256(value).hexdigest().encode()


def test_events_resent_after_delivery_yield_no_second_samples(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str,
    events: list[Event], topic_reader,
) -> None:
    """What an application does after EventProducer raised on a flush timeout: send again.
    Once, that turned 500 delivered events into 497 duplicate samples.
    """
    cfg = config(kafka_config, store_config, unique_name)
    resent = events[:500]
    publish(resent, kafka_config)
    first = ConsumerRunner(cfg).run()
    publish(resent, kafka_config)
    second = ConsumerRunner(cfg).run()
    assert second.events == 500 and second.duplicates == 500 and second.samples == 0
    ids = [orjson.loads(m.value())["sample_id"] for m in topic_reader(kafka_config.samples_topic)]
    assert len(ids) == len(set(ids)) == first.samples


def test_a_skewed_record_timestamp_does_not_stall_its_partition(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str, events: list[Event]
) -> None:
    """A record stamped a day ahead of its neighbours (and of the whole stream) is released
    out of order, counted, instead of holding back its partition.
    """
    cfg = hand_placed(config(kafka_config, store_config, unique_name))
    producer = Producer({"bootstrap.servers": kafka_config.bootstrap_servers})
    for i, event in enumerate(events):
        skew = 24 * 3_600_000 if i == 99 else 0
        producer.produce(
            kafka_config.events_topic, event.to_json(), key=event.user_id.encode(),
            partition=i % 3, timestamp=event.ts + skew,
        )
    assert producer.flush(10) == 0
    stats = ConsumerRunner(cfg).run()
    assert stats.events == len(events)
    assert stats.out_of_order >= 1
