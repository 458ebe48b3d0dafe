"""The consumer runner on the real broker and Redis: bad input never crashes or vanishes."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Producer

from streamrec import faults
from streamrec.config import KafkaConfig, RedisConfig, StreamrecConfig
from streamrec.consumers.runner import ConsumerRunner
from streamrec.datasets import read_events
from streamrec.featurestore import RedisFeatureStore


def config(kafka: KafkaConfig, redis_cfg: RedisConfig, unique: str) -> StreamrecConfig:
    return StreamrecConfig(
        kafka=kafka,
        redis=redis_cfg,
        consumer={"group_id": f"c-{unique}", "idle_exit_s": 3.0, "batch_size": 300, "negatives": 1},
    )


@pytest.fixture(scope="module")
def taobao_events(taobao_path: Path):
    return read_events(taobao_path, limit=1500)


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
]


def test_malformed_events_go_to_the_dlq_and_valid_ones_are_all_processed(
    kafka_config: KafkaConfig, redis_config: RedisConfig, unique_name: str, taobao_events,
    topic_reader,
) -> None:
    cfg = config(kafka_config, redis_config, unique_name)
    producer = Producer({"bootstrap.servers": kafka_config.bootstrap_servers})
    bad_every = len(taobao_events) // len(MALFORMED)
    for i, event in enumerate(taobao_events):
        producer.produce(kafka_config.events_topic, key=event.user_id.encode(), value=event.to_json())
        if i % bad_every == 0 and i // bad_every < len(MALFORMED):
            producer.produce(kafka_config.events_topic, key=b"1", value=MALFORMED[i // bad_every][0])
    producer.produce(kafka_config.events_topic, key=b"1", value=None)  # a tombstone
    assert producer.flush(10) == 0

    stats = ConsumerRunner(cfg).run()

    assert stats.events == len(taobao_events)
    assert stats.dead == len(MALFORMED) + 1
    dead = [orjson.loads(m.value()) for m in topic_reader(kafka_config.dlq_topic)]
    assert len(dead) == stats.dead
    reasons = [d["reason"] for d in dead]
    for _, expected in MALFORMED:
        assert sum(expected in r for r in reasons) == 1, (expected, reasons)
    assert any("empty record" in r for r in reasons)
    for letter in dead:
        assert letter["topic"] == kafka_config.events_topic and letter["offset"] >= 0

    # Every valid event reached its user's sequence (the cap is larger than any user here).
    store = RedisFeatureStore(redis_config, cfg.consumer.sequence_length)
    per_user = Counter(e.user_id for e in taobao_events)
    for user, count in per_user.items():
        assert len(store.sequence(user)) == min(count, cfg.consumer.sequence_length)

    samples = topic_reader(kafka_config.samples_topic)
    assert len(samples) == stats.samples
    positives = sum(1 for e in taobao_events if e.action == "pv")
    ids = [orjson.loads(m.value())["sample_id"] for m in samples]
    assert len(set(ids)) == len(ids)
    assert sum("~n" not in i for i in ids) == positives


@pytest.mark.parametrize("point", ["consumer.after_store", "consumer.before_commit"])
def test_a_crash_mid_batch_loses_and_duplicates_nothing(
    point: str, kafka_config: KafkaConfig, redis_config: RedisConfig, unique_name: str,
    taobao_events, topic_reader, monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = config(kafka_config, redis_config, unique_name)
    producer = Producer({"bootstrap.servers": kafka_config.bootstrap_servers})
    for event in taobao_events:
        producer.produce(kafka_config.events_topic, key=event.user_id.encode(), value=event.to_json())
    assert producer.flush(10) == 0

    faults.reset()
    monkeypatch.setenv(faults.ENV, f"{point}:2")  # the second batch dies half-way
    first = ConsumerRunner(cfg)
    with pytest.raises(faults.InjectedFault):
        first.run()
    assert first.stats.batches == 1
    monkeypatch.delenv(faults.ENV)
    second = ConsumerRunner(cfg).run()
    assert first.stats.events + second.events == len(taobao_events)

    samples = [orjson.loads(m.value()) for m in topic_reader(kafka_config.samples_topic)]
    ids = [s["sample_id"] for s in samples]
    assert len(ids) == len(set(ids)), "a sample was emitted twice"
    positives = {e.event_id for e in taobao_events if e.action == "pv"}
    assert {i for i in ids if "~n" not in i} == positives
    store = RedisFeatureStore(redis_config, cfg.consumer.sequence_length)
    for user, count in Counter(e.user_id for e in taobao_events).items():
        assert len(store.sequence(user)) == min(count, cfg.consumer.sequence_length)


def test_two_consumers_in_one_group_share_the_work_exactly_once(
    kafka_config: KafkaConfig, redis_config: RedisConfig, unique_name: str,
    taobao_path: Path, topic_reader,
) -> None:
    taobao_events = read_events(taobao_path)  # all 84k: enough work to overlap a rebalance
    cfg = config(kafka_config, redis_config, unique_name)
    cfg = cfg.model_copy(update={"consumer": cfg.consumer.model_copy(update={"idle_exit_s": 5.0})})
    producer = Producer({"bootstrap.servers": kafka_config.bootstrap_servers})
    for event in taobao_events:
        producer.produce(kafka_config.events_topic, key=event.user_id.encode(), value=event.to_json())
    assert producer.flush(10) == 0

    runners = [ConsumerRunner(cfg), ConsumerRunner(cfg)]
    results: list = [None, None]
    threads = [
        threading.Thread(target=lambda i=i: results.__setitem__(i, runners[i].run()))
        for i in range(2)
    ]
    threads[0].start()
    time.sleep(1.0)  # the second one joins while the first is at work: a rebalance
    threads[1].start()
    for thread in threads:
        thread.join(120)
    assert all(r is not None for r in results), "a runner failed"
    assert sum(r.events for r in results) == len(taobao_events)
    assert all(r.events > 0 for r in results), [r.events for r in results]

    samples = [orjson.loads(m.value()) for m in topic_reader(kafka_config.samples_topic)]
    ids = [s["sample_id"] for s in samples]
    assert len(ids) == len(set(ids))
    assert {i for i in ids if "~n" not in i} == {e.event_id for e in taobao_events if e.action == "pv"}
