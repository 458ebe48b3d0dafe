"""A user's sequence stays in Redis's compact sorted-set encoding (listpack).

Redis keeps a sorted set as a listpack up to ``zset-max-listpack-entries`` (128) entries of up
to ``zset-max-listpack-value`` (64) bytes and converts it to a skiplist, about three times the
bytes, once it passes either; it never converts back by itself. A user's one batch can push
the sequence past 128 entries before the trim: the store must leave it compact afterwards.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import cast

import pytest
import redis
from redis.cluster import RedisCluster

from streamrec.config import RedisStoreConfig
from streamrec.events import Event
from streamrec.featurestore import Arrival, FeatureStore, MemoryFeatureStore, RedisFeatureStore, Verdict
from tests.integration.conftest import PrivateService
from tests.integration.featurestore.test_contract import random_batches

T0 = 1_511_658_000_000
HOUR = 3_600_000
LENGTH = 50  # STREAMREC_MODEL__SEQUENCE_LENGTH's default
COMPACT = ("listpack", "ziplist")  # Redis 7's name, and 6.2's
WORDS = {"two": 2, "three": 3, "four": 4, "five": 5}


@pytest.fixture
def store(store_config: RedisStoreConfig, redis_client: redis.Redis) -> Iterator[RedisFeatureStore]:
    """A store of the default length; the client empties the database after."""
    yield RedisFeatureStore(store_config, LENGTH, HOUR)


def events(first: int, count: int, user: str = "u") -> list[Event]:
    """``count`` events of ``user``, a second apart from ``first``; Taobao-shaped members."""
    return [
        Event(f"e{i:06d}", user, f"{2_268_318 + i}", "2520377", "pv", T0 + i * 1000)
        for i in range(first, first + count)
    ]


def update(store: FeatureStore, batch: list[Event]) -> list[list[str]]:
    """One batch, every event asking for its history; the histories' event ids."""
    got = store.update([Arrival(e, f"0:{e.event_id}", True) for e in batch]).all()
    assert [answer[0] for answer in got] == [Verdict.ACCEPTED] * len(batch)
    return [[b.event_id for b in answer[1] or []] for answer in got]


def encoding(client: redis.Redis, key: str) -> str:
    return str(client.object("encoding", key), "ascii")


def light(client: redis.Redis, key: str) -> int:
    """The bytes of the same entries written afresh (a compact key)."""
    entries = cast(list[tuple[bytes, float]], client.zrange(key, 0, -1, withscores=True))
    client.zadd("fresh", dict(entries))
    assert encoding(client, "fresh") in COMPACT
    bytes_ = usage(client, "fresh")
    client.delete("fresh")
    return bytes_


def usage(client: redis.Redis, key: str) -> int:
    """``MEMORY USAGE`` of the whole key."""
    return int(cast(int, client.memory_usage(key, samples=0)))


def test_a_batch_that_passes_the_compact_limit_before_the_trim_leaves_the_user_compact(
    store: RedisFeatureStore, redis_client: redis.Redis
) -> None:
    """100 stored, then 60 more in one batch: 160 before the trim, 110 after it."""
    update(store, events(0, 100))
    key = store.key("u")
    assert encoding(redis_client, key) in COMPACT
    batch = events(100, 60)
    first = update(store, batch)
    assert redis_client.zcard(key) == LENGTH + 60  # what a redo of the batch reads
    assert encoding(redis_client, key) in COMPACT
    assert usage(redis_client, key) <= light(redis_client, key) * 1.1
    assert 0 < redis_client.pttl(key)
    assert update(store, batch) == first  # a redo reads the same histories
    assert first[0] == [f"e{i:06d}" for i in range(50, 100)]
    assert [b.event_id for b in store.sequence("u")] == [f"e{i:06d}" for i in range(110, 160)]


def test_a_cluster_store_leaves_the_user_compact_too(redis_cluster_url: str, unique_name: str) -> None:
    """The same script on a Redis Cluster: the user's keys on their own primary."""
    cfg = RedisStoreConfig(url=redis_cluster_url, cluster=True, key_prefix=unique_name)
    store = RedisFeatureStore(cfg, LENGTH, HOUR)
    client = RedisCluster.from_url(redis_cluster_url)
    try:
        update(store, events(0, 100))
        update(store, events(100, 60))
        key = store.key("u")
        assert client.zcard(key) == LENGTH + 60
        assert str(client.object("encoding", key), "ascii") in COMPACT
    finally:
        client.close()


def test_a_user_that_was_over_the_limit_once_is_compact_again(
    store: RedisFeatureStore, redis_client: redis.Redis
) -> None:
    """A batch of 200 of one user must be kept whole (its redo reads them); the next is compact."""
    update(store, events(0, 200))
    key = store.key("u")
    assert encoding(redis_client, key) == "skiplist"  # 200 entries: no compact form holds them
    update(store, events(200, 10))
    assert redis_client.zcard(key) == LENGTH + 10
    assert encoding(redis_client, key) in COMPACT
    assert usage(redis_client, key) <= light(redis_client, key) * 1.1
    assert 0 < redis_client.pttl(key)
    assert [b.event_id for b in store.sequence("u")] == [f"e{i:06d}" for i in range(160, 210)]


def test_a_sequence_longer_than_the_compact_limit_is_warned_of(
    store_config: RedisStoreConfig, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """STREAMREC_MODEL__SEQUENCE_LENGTH past zset-max-listpack-entries: the operator is told."""
    store = RedisFeatureStore(store_config, 200, HOUR)
    with caplog.at_level("WARNING", logger="streamrec.featurestore"):
        update(store, events(0, 1))
    assert "zset-max-listpack-entries 128" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="streamrec.featurestore"):
        update(RedisFeatureStore(store_config, LENGTH, HOUR), events(1, 1))
    assert caplog.text == ""


def test_the_warning_quotes_what_redis_spends_on_a_skiplist(
    store_config: RedisStoreConfig, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """The factor the warning gives is Redis's: a full sequence of 200 as a skiplist against the
    same entries compact (`MEMORY USAGE`), within half of it.
    """
    store = RedisFeatureStore(store_config, 200, HOUR)
    with caplog.at_level("WARNING", logger="streamrec.featurestore"):
        update(store, events(0, 200))
    said = re.search(r"about (\w+) times the bytes", caplog.text)
    assert said is not None, caplog.text
    key = store.key("u")
    assert encoding(redis_client, key) == "skiplist"
    entries = str(redis_client.config_get("zset-max-listpack-entries")["zset-max-listpack-entries"])
    redis_client.config_set("zset-max-listpack-entries", 256)
    try:
        factor = usage(redis_client, key) / light(redis_client, key)
    finally:
        redis_client.config_set("zset-max-listpack-entries", entries)
    word = said.group(1)
    assert abs(factor - WORDS[word]) <= 0.5, f"measured {factor:.2f}, the warning says {word}"


def test_a_random_stream_past_a_small_compact_limit_answers_as_memory_does(
    private_redis: PrivateService, unique_name: str
) -> None:
    """Redis told to keep only 6 entries compact: sequences of 4 pass it and are written afresh
    in many batches, redone ones too; every answer is still the memory store's, and every
    sequence within the limit is compact.
    """
    client = redis.Redis(host="127.0.0.1", port=private_redis.port)
    client.config_set("zset-max-listpack-entries", 6)
    cfg = RedisStoreConfig(url=f"redis://127.0.0.1:{private_redis.port}", key_prefix=unique_name)
    store = RedisFeatureStore(cfg, 4, HOUR)
    memory = MemoryFeatureStore(4, HOUR)
    over: set[str] = set()  # users whose sequence was past the limit
    rewritten = 0
    for batch_no, arrivals, times in random_batches(11):
        for _ in range(times):
            assert store.update(arrivals).all() == memory.update(arrivals).all(), batch_no
            for user in {a.event.user_id for a in arrivals}:
                key = store.key(user)
                if client.zcard(key) > 6:
                    over.add(user)
                    continue
                assert encoding(client, key) in COMPACT, (batch_no, user)
                rewritten += user in over
                over.discard(user)
    assert rewritten > 5
    for user in (f"u{i}" for i in range(6)):
        assert store.sequence(user) == memory.sequence(user)
