"""Declared user features through the consumer runner, on the real broker and Redis: each sample,
negatives included, carries the user's value as of its time, and Redis holds the points.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable
from typing import Any, cast

import orjson
import redis
from confluent_kafka import Message

from streamrec.config import ConsumerConfig, KafkaConfig, RedisStoreConfig, StreamrecConfig
from streamrec.consumers.native_runner import ConsumerRunner
from streamrec.consumers.processor import SampleBuilder
from streamrec.consumers.rebuild import rebuild_store
from streamrec.features.schema import FeatureSchema, FeatureSpec
from streamrec.featurestore import MemoryFeatureStore, RedisFeatureStore
from streamrec.featurestore.profiles import MemoryProfileStore
from streamrec.featurestore.redis_profiles import RedisProfileStore
from streamrec.kafka.records import Record
from tests.integration.conftest import app_producer

T0 = 1_511_658_000_000


def click(k: int, seconds: int, user: str = "u1", **extra: object) -> dict[str, Any]:
    return {
        "event_id": f"e{k}",
        "user_id": user,
        "item_id": f"i{k}",
        "category_id": "c1",
        "action": "pv",
        "ts": T0 + seconds * 1000,
        **extra,
    }


def config(kafka: KafkaConfig, store: RedisStoreConfig, unique: str) -> StreamrecConfig:
    return StreamrecConfig.model_validate(
        {
            "kafka": kafka,
            "store": store,
            "consumer": {"group_id": f"c-{unique}", "stop_when_idle_s": 3.0, "negatives": 1},
            "features": [{"name": "tier", "field": "membership", "role": "user"}],
        }
    )


def send(kafka: KafkaConfig, docs: list[dict[str, Any]]) -> None:
    producer = app_producer(kafka)
    for doc in docs:
        producer.produce(kafka.events_topic, key=doc["user_id"].encode(), value=orjson.dumps(doc))
    assert producer.flush(10) == 0


def test_samples_carry_the_users_features_as_of_their_time(
    kafka_config: KafkaConfig,
    store_config: RedisStoreConfig,
    redis_client: redis.Redis,
    unique_name: str,
    topic_reader: Callable[[str], list[Message]],
) -> None:
    cfg = config(kafka_config, store_config, unique_name)
    docs = [  # one user's events out of order: gold, stamped last but one, arrives first
        click(0, 1, "u2"),  # another user's item, for the negatives
        click(1, 30, membership="gold"),
        click(2, 10, membership="silver"),
        click(3, 20),
        click(4, 5),
        click(5, 40),
        click(2, 10, membership="silver"),  # resent: a duplicate, no samples, no new point
        click(1, 50, membership="platinum", item_id="i9"),  # e1 reused: dead-lettered, no point
    ]
    send(kafka_config, docs)
    stats = ConsumerRunner(cfg).run()
    assert stats.duplicates == 1
    samples = [orjson.loads(cast(bytes, m.value())) for m in topic_reader(kafka_config.samples_topic)]
    tiers = {s["sample_id"]: s.get("features", {}).get("tier") for s in samples if s["user_id"] == "u1"}
    assert tiers == {
        "e1": "gold",
        "e1~n0": "gold",
        "e2": "silver",
        "e2~n0": "silver",
        "e3": "silver",
        "e3~n0": "silver",  # not gold: gold is stamped later
        "e4": None,
        "e4~n0": None,  # before any value: the default (no "features" on the wire)
        "e5": "gold",
        "e5~n0": "gold",
    }
    key = f"{store_config.key_prefix}:prof:{{u1}}"
    stored = cast(dict[bytes, bytes], redis_client.hgetall(key))
    assert stored == {b"tier": f'{T0 + 10_000}\x1f"silver"\x1e{T0 + 30_000}\x1f"gold"'.encode()}
    assert 0 < redis_client.pttl(key) <= store_config.ttl_s * 1000
    assert not redis_client.exists(f"{store_config.key_prefix}:prof:{{u2}}")  # no user features, no key


def test_a_rebuild_restores_the_users_features(
    kafka_config: KafkaConfig,
    store_config: RedisStoreConfig,
    redis_client: redis.Redis,
    unique_name: str,
) -> None:
    reused = click(1, 50, membership="platinum", item_id="i9")  # e1 reused for other content: no point
    send(kafka_config, [click(1, 30, membership="gold"), click(2, 10, membership="silver"), click(3, 20)])
    send(kafka_config, [reused])
    cfg = config(kafka_config, store_config, unique_name)
    ConsumerRunner(cfg).run()  # a rebuild replays what the consumers processed
    redis_client.flushdb()
    rebuild_store(cfg)
    stored = cast(dict[bytes, bytes], redis_client.hgetall(f"{store_config.key_prefix}:prof:{{u1}}"))
    assert stored == {b"tier": f'{T0 + 10_000}\x1f"silver"\x1e{T0 + 30_000}\x1f"gold"'.encode()}


def _stream(rng: random.Random) -> list[Record]:
    """2,000 events of 300 users over two partitions: some late, some resent, a few reused ids,
    most carrying a tier that changes now and then.
    """
    docs: list[dict[str, Any]] = []
    for i in range(2_000):
        seconds = i - (rng.randrange(60) if rng.random() < 0.1 else 0)
        doc = click(i, seconds, f"u{rng.randrange(300)}")
        if rng.random() < 0.8:
            doc["membership"] = rng.choice(["basic", "silver", "gold"])
        docs.append(doc)
        if rng.random() < 0.05:
            docs.append(docs[rng.randrange(len(docs))])  # resent
        if rng.random() < 0.02:
            docs.append({**docs[rng.randrange(len(docs))], "item_id": "reused"})
    offsets = [0, 0]
    records = []
    for doc in docs:
        partition = zlib.crc32(doc["user_id"].encode()) % 2
        records.append(Record(orjson.dumps(doc), offsets[partition], partition=partition))
        offsets[partition] += 1
    return records


def test_redis_and_memory_join_the_same_user_features(store_config: RedisStoreConfig) -> None:
    rng = random.Random(28)
    records = _stream(rng)
    cfg = ConsumerConfig(negatives=1, allowed_lateness_ms=30_000, late_events="sequence_only")
    users = FeatureSchema.of([FeatureSpec(name="tier", field="membership", role="user")])
    on_redis = SampleBuilder(
        cfg, RedisFeatureStore(store_config, 5), profiles=RedisProfileStore(store_config, 4), schema=users
    )
    in_memory = SampleBuilder(cfg, MemoryFeatureStore(5), profiles=MemoryProfileStore(4), schema=users)
    start, with_tier = 0, 0
    while start < len(records):
        end = min(len(records), start + rng.randrange(100, 500))
        batch = records[start:end]
        for builder in (on_redis, in_memory):
            if rng.random() < 0.3:
                builder.process(batch, now_ms=T0 + 10**8)  # aborted: done again below
        got = [builder.process(batch, now_ms=T0 + 10**8) for builder in (on_redis, in_memory)]
        assert got[0].values == got[1].values
        for builder, result in zip((on_redis, in_memory), got, strict=True):
            builder.commit(result)
        with_tier += sum("tier" in s.features for s in got[0].samples)
        start = end
    assert with_tier > 1000


def test_a_user_with_more_events_in_a_batch_than_points_kept_reads_each_events_own_value(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, redis_client: redis.Redis, unique_name: str,
    topic_reader: Callable[[str], list[Message]],
) -> None:
    """7 events of one user in order, 4 points kept: the earliest 3 read nothing before (the
    batch's points were written, the 4 newest kept, before its samples read them).
    """
    cfg = config(kafka_config, store_config, unique_name)
    cfg = cfg.model_copy(update={"consumer": cfg.consumer.model_copy(update={"profile_points": 4})})
    send(kafka_config, [click(0, 1, "u2"), *(click(k, 10 * k, membership=f"t{k}") for k in range(1, 8))])
    ConsumerRunner(cfg).run()
    samples = [orjson.loads(cast(bytes, m.value())) for m in topic_reader(kafka_config.samples_topic)]
    tiers = {s["sample_id"]: s.get("features", {}).get("tier") for s in samples if "~" not in s["sample_id"]}
    assert tiers == {"e0": None, **{f"e{k}": f"t{k}" for k in range(1, 8)}}
    stored = cast(dict[bytes, bytes], redis_client.hgetall(f"{store_config.key_prefix}:prof:{{u1}}"))
    assert stored[b"tier"].count(b"\x1e") == 3  # the store keeps its 4 newest, as before
