"""One feature-store contract, run on Redis and on the in-memory store."""

from __future__ import annotations

import pytest
import redis

from streamrec.config import RedisStoreConfig
from streamrec.events import Event
from streamrec.featurestore import FeatureStore, MemoryFeatureStore, RedisFeatureStore

T0 = 1_511_658_000_000


@pytest.fixture(params=["redis", "redis-cluster", "memory"])
def store(request: pytest.FixtureRequest, unique_name: str) -> FeatureStore:
    if request.param == "memory":
        return MemoryFeatureStore(length=3)
    if request.param == "redis-cluster":
        url = request.getfixturevalue("redis_cluster_url")
        return RedisFeatureStore(RedisStoreConfig(url=url, cluster=True, key_prefix=unique_name), 3)
    cfg: RedisStoreConfig = request.getfixturevalue("store_config")
    return RedisFeatureStore(cfg, length=3)


def ev(i: int, user: str = "u", ts: int | None = None) -> Event:
    return Event(f"e{i:03d}", user, f"i{i}", f"c{i % 2}", "pv", T0 + (i if ts is None else ts) * 1000)


def test_history_is_strictly_earlier_latest_first_capped(store: FeatureStore) -> None:
    events = [ev(i) for i in range(6)]
    histories = store.update(events, [events[0], events[2], events[5]]).histories
    assert histories[0] == []
    assert [b.item_id for b in histories[1]] == ["i0", "i1"]
    assert [b.item_id for b in histories[2]] == ["i2", "i3", "i4"]
    assert [b.event_id for b in store.sequence("u")] == ["e003", "e004", "e005"]


def test_equal_times_are_excluded_and_ordered_by_event_id(store: FeatureStore) -> None:
    events = [ev(2, ts=5), ev(1, ts=5), ev(0, ts=4)]
    (history,) = store.update(events, [events[0]]).histories
    assert [b.event_id for b in history] == ["e000"]
    assert [b.event_id for b in store.sequence("u")] == ["e000", "e001", "e002"]


def test_append_is_idempotent_and_late_events_land_in_time_order(store: FeatureStore) -> None:
    store.update([ev(1), ev(3)], [])
    store.update([ev(1), ev(3), ev(2)], [])
    seq = store.sequence("u")
    assert [b.event_id for b in seq] == ["e001", "e002", "e003"]
    assert seq[0].category_id == "c1" and seq[0].action == "pv" and seq[0].ts == T0 + 1000


def test_a_redone_batch_reads_the_same_histories(store: FeatureStore) -> None:
    """A batch whose commit aborted runs again: the store must not have trimmed what it reads."""
    store.update([ev(i) for i in range(5)], [])
    batch = [ev(i) for i in range(5, 10)]
    first = store.update(batch, batch).histories
    again = store.update(batch, batch).histories
    assert again == first
    assert [b.item_id for b in first[0]] == ["i2", "i3", "i4"]
    assert [b.event_id for b in store.sequence("u")] == ["e007", "e008", "e009"]


def test_first_seen_is_recorded_once_per_item(store: FeatureStore) -> None:
    first = store.update([ev(5), Event("x", "v", "i5", "c", "pv", T0 + 3000)], [])
    assert first.first_seen == {"i5": T0 + 3000}
    later = store.update([Event("y", "w", "i5", "c", "pv", T0 + 9000), ev(7)], [])
    assert later.first_seen == {"i5": T0 + 3000, "i7": T0 + 7000}


def test_users_are_independent(store: FeatureStore) -> None:
    store.update([ev(1, "a"), ev(2, "b")], [])
    assert [b.item_id for b in store.sequence("a")] == ["i1"]
    assert [b.item_id for b in store.sequence("b")] == ["i2"]
    assert store.sequence("nobody") == []


def test_redis_keys_are_hash_tagged_and_expire(
    store_config: RedisStoreConfig, redis_client: redis.Redis
) -> None:
    store = RedisFeatureStore(store_config, length=3)
    store.update([ev(1, "42")], [])
    key = store.key("42")
    assert key == f"{store_config.key_prefix}:seq:{{42}}"
    assert 0 < redis_client.pttl(key) <= store_config.ttl_s * 1000


def test_redis_reloads_its_scripts_after_a_flush(
    store_config: RedisStoreConfig, redis_client: redis.Redis
) -> None:
    store = RedisFeatureStore(store_config, length=3)
    store.update([ev(1)], [])
    redis_client.script_flush()  # as after a restart or a failover
    (history,) = store.update([ev(2)], [ev(2)]).histories
    assert [b.item_id for b in history] == ["i1"]
