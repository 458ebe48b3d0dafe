"""Declared features in the ``join`` mode through the consumer runner, on the real broker and Redis.

Each decided sample carries what the sampled mode gives the same impression (its target's
behaviour values, its context, the user's values as of its time, its history's values), its
window having kept them in Redis between batches; the default schema's decided samples are the
bytes they were.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import redis
from confluent_kafka import Message

from streamrec.config import KafkaConfig, RedisStoreConfig, StreamrecConfig
from streamrec.consumers.native_runner import ConsumerRunner
from streamrec.consumers.processor import SampleBuilder
from streamrec.featurestore import RedisFeatureStore
from streamrec.featurestore.redis_profiles import RedisProfileStore
from streamrec.kafka.records import Record
from streamrec.samples import Sample
from tests.integration.conftest import app_producer

T0 = 1_511_658_000_000
MINUTE = 60_000
FEATURES = [
    {"name": "shop"},
    {"name": "tags", "kind": "ids"},
    {"name": "rating", "kind": "number", "outcome": True},
    {"name": "tier", "field": "membership", "role": "user"},
    {"name": "device", "role": "context"},
]
BASE = ("event_id", "user_id", "item_id", "category_id", "action", "ts")


def doc(
    eid: str, user: str, item: str, minute: float, action: str = "impression", **fields: Any
) -> dict[str, Any]:
    return {"event_id": eid, "user_id": user, "item_id": item, "category_id": f"c{item}", "action": action,
            "ts": T0 + int(minute * MINUTE), **fields}


def feed() -> list[dict[str, Any]]:
    """Four users: behaviours with features, a tier changing, a page of impressions each (some
    clicked), a later tier the pages must not see; an hour later a flush closing every window.
    """
    out = []
    for k, user in enumerate(("u0", "u1", "u2", "u3")):
        out += [
            doc(f"{user}-v1", user, "x", -3, "pv", shop=f"s{k}", tags=["t1", "t2"], rating=4.0,
                membership="silver", device="web"),
            doc(f"{user}-v2", user, f"y{k}", -2, "pv", shop="s9", device="ios"),
            doc(f"{user}-s1", user, "a", 0, shop="sa", tags=["ta", user], rating=5.0, device="tv"),
            doc(f"{user}-s2", user, "b", 0, shop="sb", device="tv"),
            doc(f"{user}-s3", user, "c", 0, device="web"),
            doc(f"{user}-k", user, ("a", "b", "c", "z")[k], 2, "click", shop="sa", device="tv"),
            doc(f"{user}-later", user, "z", 3, "pv", membership="gold", device="web"),
            doc(f"{user}-end", user, "z", 60, "cart", device="web"),
        ]
    return sorted(out, key=lambda d: d["ts"])  # in time order: no user's events late behind another's


def impressions(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["event_id"]: d for d in docs if d["action"] == "impression"}


def config(
    kafka: KafkaConfig, store: RedisStoreConfig, unique: str, features: bool = True
) -> StreamrecConfig:
    consumer = {"group_id": f"c-{unique}", "stop_when_idle_s": 3.0, "batch_size": 7, "labels": "join",
                "label_window_ms": 10 * MINUTE, "allowed_lateness_ms": 5 * MINUTE, "negatives": 1}
    return StreamrecConfig.model_validate(
        {"kafka": kafka, "store": store, "consumer": consumer, "features": FEATURES if features else []}
    )


def send(kafka: KafkaConfig, docs: list[dict[str, Any]]) -> None:
    producer = app_producer(kafka)
    for d in docs:
        key, value = d["user_id"].encode(), orjson.dumps(d)
        producer.produce(kafka.events_topic, key=key, value=value, timestamp=d["ts"])
    assert producer.flush(10) == 0


def sampled(cfg: StreamrecConfig, store: RedisStoreConfig, docs: list[dict[str, Any]],
            labels: dict[str, int]) -> dict[str, Sample]:
    """The sampled mode's samples of the impressions, each labelled explicitly, on Redis too."""
    prefixed = store.model_copy(update={"key_prefix": f"{store.key_prefix}-sampled"})
    schema = cfg.feature_schema()
    builder = SampleBuilder(cfg.consumer.model_copy(update={"labels": "sampled"}),
                            RedisFeatureStore(prefixed, cfg.model.sequence_length, schema=schema),
                            schema=schema, profiles=RedisProfileStore(prefixed))
    labelled = [{**d, "label": labels[d["event_id"]]} if d["event_id"] in labels else d for d in docs]
    result = builder.process([Record(orjson.dumps(d), k) for k, d in enumerate(labelled)], now_ms=T0)
    return {s.sample_id: s for s in result.samples if s.sample_id in labels}


def test_decided_samples_carry_what_the_sampled_mode_gives_the_same_impression(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str,
    topic_reader: Callable[[str], list[Message]], redis_client: redis.Redis,
) -> None:
    cfg = config(kafka_config, store_config, unique_name)
    docs = feed()
    send(kafka_config, docs)

    stats = ConsumerRunner(cfg).run()

    assert stats.dead == 0 and stats.late == 0
    samples = [Sample.from_json(m.value()) for m in topic_reader(kafka_config.samples_topic)]
    shown = impressions(docs)
    decided = {s.sample_id: s for s in samples if s.sample_id in shown}
    assert sorted(decided) == sorted(shown)
    assert {s.label for s in decided.values()} == {0, 1}
    want = sampled(cfg, store_config, docs, {eid: s.label for eid, s in decided.items()})
    assert want["u0-s1"].features == {"shop": "sa", "tags": ("ta", "u0"), "tier": "silver", "device": "tv"}
    assert want["u0-s3"].seq_features == {
        "shop": ("s0", "s9"), "tags": (("t1", "t2"), None), "rating": (4.0, None)
    }
    assert decided == want
    assert redis_client.keys(f"{store_config.key_prefix}:feat:*")  # kept while their windows are


def test_the_default_schemas_decided_samples_are_the_bytes_they_were(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str,
    topic_reader: Callable[[str], list[Message]], redis_client: redis.Redis,
) -> None:
    docs = [{k: v for k, v in d.items() if k in BASE} for d in feed() if d["user_id"] == "u0"]
    send(kafka_config, docs)

    ConsumerRunner(config(kafka_config, store_config, unique_name, features=False)).run()

    values = [m.value() or b"" for m in topic_reader(kafka_config.samples_topic)]
    got = {orjson.loads(v)["sample_id"]: v for v in values}
    head = b'{"sample_id":"u0-s%d","user_id":"u0","ts":%d,"item_id":"%s","category_id":"c%s","label":%d,'
    seq = b'"seq_items":["x","y0"],"seq_categories":["cx","cy0"]}'
    assert [got[f"u0-s{k}"] for k in (1, 2, 3)] == [
        head % (1, T0, b"a", b"a", 1) + seq, head % (2, T0, b"b", b"b", 0) + seq,
        head % (3, T0, b"c", b"c", 0) + seq,
    ]
    assert not redis_client.keys(f"{store_config.key_prefix}:feat:*")
