"""Declared features through the consumers on the real broker and Redis: events with extras
in, samples carrying them point-in-time out, a bad value dead-lettered naming its feature;
the default schema's samples exactly as before.
"""

from __future__ import annotations

import hashlib
import zlib

import orjson

from streamrec.config import ConsumerConfig, KafkaConfig, RedisStoreConfig, StreamrecConfig
from streamrec.consumers.native_runner import ConsumerRunner
from streamrec.consumers.processor import SampleBuilder
from streamrec.datasets.synthetic import ClickStreamSpec, generate_clicks
from streamrec.events import Event
from streamrec.features.schema import Value
from streamrec.featurestore import RedisFeatureStore
from streamrec.kafka.records import Record
from streamrec.producer import publish
from tests.integration.conftest import app_producer

T0 = 1_511_658_000_000
FEATURES = [
    {"name": "shop"},
    {"name": "tags", "kind": "ids", "max_ids": 3},
    {"name": "price", "field": "price_cents", "kind": "number", "transform": "log1p"},
    {"name": "rating", "kind": "number", "outcome": True},
    {"name": "device", "role": "context"},
]
ITEM_FEATURES = ("shop", "tags", "price")  # a target's and a negative's: the outcome is not


def item_values(item: int) -> dict[str, Value]:
    """An item's behaviour features: the same at every event (tags left out of every third)."""
    values: dict[str, Value] = {"shop": f"s{item % 4}", "price": float(item * 10)}
    if item % 3:
        values["tags"] = tuple(f"t{item + k}" for k in range(item % 3))
    return values


def stream() -> list[Event]:
    """6 users' clicks on 9 items, one a second; a rating on every other, devices by turn."""
    events = []
    for k in range(60):
        item = k * 5 % 9
        features = {**item_values(item), "device": ("ios", "web", "tv")[k % 3]}
        if k % 2:
            features["rating"] = float(k % 5)
        events.append(Event(f"e{k}", f"u{k % 6}", f"i{item}", f"c{item % 2}", "pv", T0 + k * 1000,
                            features=features))
    return events


def test_declared_features_flow_from_events_to_samples(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str, topic_reader
) -> None:
    consumer = {"group_id": f"c-{unique_name}", "stop_when_idle_s": 3.0, "batch_size": 25, "negatives": 1}
    cfg = StreamrecConfig.model_validate(
        {"kafka": kafka_config, "store": store_config, "consumer": consumer, "features": FEATURES}
    )
    schema = cfg.feature_schema()
    events = stream()
    producer = app_producer(kafka_config)
    for event in events:
        producer.produce(kafka_config.events_topic, key=event.user_id.encode(), value=event.to_json(schema))
    bad = {**orjson.loads(events[0].to_json(schema)), "event_id": "bad", "price_cents": "cheap"}
    producer.produce(kafka_config.events_topic, key=b"u0", value=orjson.dumps(bad))
    assert producer.flush(10) == 0

    stats = ConsumerRunner(cfg).run()

    assert stats.events == len(events) and stats.dead == 1
    [letter] = topic_reader(kafka_config.dlq_topic)
    reason = dict(letter.headers() or [])["streamrec.reason"].decode()
    assert reason == "feature 'price' (field 'price_cents') must be a number, got str"
    samples = [orjson.loads(m.value()) for m in topic_reader(kafka_config.samples_topic)]
    by_id = {e.event_id: e for e in events}
    positives = [s for s in samples if "~n" not in s["sample_id"]]
    assert len(positives) == len(events)
    for sample in positives:
        event = by_id[sample["sample_id"]]
        earlier = [e for e in events if e.user_id == event.user_id and e.ts < event.ts]
        assert sample["seq_items"] == [e.item_id for e in earlier]
        target = {n: v for n, v in event.features.items() if n != "rating"}
        assert _plain(sample.get("features", {})) == _plain(target)
        expected = {n: [e.features.get(n) for e in earlier] for n in (*ITEM_FEATURES, "rating")}
        assert _plain(sample.get("seq_features", {})) == (_plain(expected) if earlier else {})
    negatives = [s for s in samples if "~n" in s["sample_id"]]
    assert negatives
    for sample in negatives:  # the item's values, its event's context, never an outcome
        event = by_id[sample["sample_id"].split("~")[0]]
        item = int(sample["item_id"][1:])
        expected_values = {**item_values(item), "device": event.features["device"]}
        assert _plain(sample["features"]) == _plain(expected_values)


def _plain(doc: object) -> object:
    """JSON's view of a value (tuples as lists)."""
    return orjson.loads(orjson.dumps(doc))


# The default schema's samples of this stream, as the consumers made them before declared
# features existed (main at 8b4be02, the same run): stored marks, members and samples unchanged.
BEFORE = (7742, "ac551ab0aaa0ae8ba9c0ed9192906d55805b0c3123d5cf0a21f495eeabccda23")


def test_the_default_schema_makes_byte_identical_samples(store_config: RedisStoreConfig) -> None:
    events = generate_clicks(ClickStreamSpec(users=200, items=300, events=3000, seed=3))
    offsets = [0, 0]
    records = []
    for e in events:
        partition = zlib.crc32(e.user_id.encode()) % 2
        records.append(Record(e.to_json(), offsets[partition], partition=partition))
        offsets[partition] += 1
    cfg = ConsumerConfig(negatives=2, negative_history_share=0.3)
    builder = SampleBuilder(cfg, RedisFeatureStore(store_config, 10, 3_600_000))
    digest, count = hashlib.sha256(), 0
    for start in range(0, len(records), 500):
        result = builder.process(records[start : start + 500], now_ms=events[-1].ts + 1)
        builder.commit(result)
        count += len(result.values)
        for value in result.values:
            digest.update(value + b"\n")
    assert (count, digest.hexdigest()) == BEFORE


def test_the_producer_writes_declared_features_at_their_fields(
    kafka_config: KafkaConfig, topic_reader
) -> None:
    cfg = StreamrecConfig.model_validate({"kafka": kafka_config, "features": FEATURES})
    [event] = stream()[:1]
    assert publish([event], kafka_config, schema=cfg.feature_schema()) == 1
    [record] = topic_reader(kafka_config.events_topic)
    doc = orjson.loads(record.value())
    assert doc["price_cents"] == 0.0 and "price" not in doc and doc["device"] == "ios"
