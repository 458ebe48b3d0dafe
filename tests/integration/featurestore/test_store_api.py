"""The feature stores from a program: wrong items to ``update`` and ``close``, on Redis and in memory.

Found by the Python-API tour, left and mended by the carried-defects tour (tests first).
"""

from __future__ import annotations

import time

import pytest
import redis

from streamrec.config import RedisStoreConfig
from streamrec.events import Event
from streamrec.featurestore import Arrival, FeatureStore, MemoryFeatureStore, RedisFeatureStore
from streamrec.featurestore.profiles import MemoryProfileStore, ProfilePoint
from streamrec.featurestore.redis_profiles import RedisProfileStore

T0 = 1_700_000_000_000


@pytest.fixture(params=["redis", "memory"])
def store(request: pytest.FixtureRequest) -> FeatureStore:
    if request.param == "memory":
        return MemoryFeatureStore(length=3)
    cfg: RedisStoreConfig = request.getfixturevalue("store_config")
    made = RedisFeatureStore(cfg, 3)
    made.attach(can_start_empty=True)
    return made


def click(k: int) -> Event:
    return Event(f"e{k}", "u1", f"i{k}", "c1", "click", T0 + k)


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ([click(0)], r"item 0 is an Event .*: wrap each event as Arrival\(event, origin\)"),
        (lambda: [Arrival(click(0), "0:0"), "e1"], r"item 1 is a str 'e1'"),
        (lambda: click(0), r"not a sequence: an Event"),
        (None, r"not a sequence: a NoneType"),
    ],
    ids=["events", "a string among arrivals", "one event", "None"],
)
def test_update_given_no_arrivals_is_a_type_error_naming_what_it_takes(
    store: FeatureStore, given: object, named: str
) -> None:
    """Before: ``AttributeError: 'Event' object has no attribute 'event'`` from inside the store
    (the Redis store's the same), and ``'NoneType' object is not iterable``.
    """
    items = given() if callable(given) else given
    with pytest.raises(TypeError, match=r"update takes a sequence of Arrival, .*" + named):
        store.update(items)  # type: ignore[arg-type]  # the wrong type is the point
    assert store.sequence("u1") == []  # nothing of the batch stored


def connections(client: redis.Redis) -> int:
    return len(client.client_list())


def settled(client: redis.Redis, want: int) -> int:
    """The clients Redis counts, once it counts ``want`` (a closed socket is noticed at once or so)."""
    deadline = time.monotonic() + 2
    while (now := connections(client)) != want and time.monotonic() < deadline:
        time.sleep(0.02)
    return now


def used(store: FeatureStore) -> None:
    store.attach(can_start_empty=True)
    update = store.update([Arrival(click(k), f"0:{k}", wants_history=True) for k in range(3)])
    assert [len(h or ()) for h in update.histories] == [0, 1, 2]


def test_a_redis_store_closes_its_connections_again_and_again_and_as_a_with_block(
    store_config: RedisStoreConfig, redis_client: redis.Redis
) -> None:
    """Before: ``RedisFeatureStore`` had no ``close()``; its pool's connections stayed open until the
    process exited or the store was collected (a program making a store per job kept them all).
    """
    alone = connections(redis_client)
    store = RedisFeatureStore(store_config, 3)
    used(store)
    assert connections(redis_client) > alone
    store.close()
    assert settled(redis_client, alone) == alone
    store.close()  # again: nothing left to close, no error
    with RedisFeatureStore(store_config, 3) as other:
        used(other)
        assert connections(redis_client) > alone
    assert settled(redis_client, alone) == alone


def test_a_redis_store_leaves_a_client_it_was_given_open(
    store_config: RedisStoreConfig, redis_client: redis.Redis
) -> None:
    given = redis.Redis.from_url(store_config.url, decode_responses=True)
    with RedisFeatureStore(store_config, 3, client=given) as store:
        used(store)
    assert given.ping()  # the caller's to close
    given.close()


def test_a_memory_store_closes_as_a_redis_store_does() -> None:
    with MemoryFeatureStore(length=3) as store:
        used(store)
    store.close()


def test_a_redis_profile_store_closes_as_the_feature_store_does(
    store_config: RedisStoreConfig, redis_client: redis.Redis
) -> None:
    """Its neighbour, the user-feature store, had no ``close()`` either (the same pool held)."""
    alone = connections(redis_client)
    with RedisProfileStore(store_config, 4) as store:
        store.update([ProfilePoint("u1", T0, {"tier": "gold"})])
        assert connections(redis_client) > alone
    assert settled(redis_client, alone) == alone
    store.close()
    with MemoryProfileStore(4) as memory:
        memory.update([ProfilePoint("u1", T0, {"tier": "gold"})])
    memory.close()
