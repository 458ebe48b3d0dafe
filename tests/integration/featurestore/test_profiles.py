"""One profile-store contract (user features, point in time), run on Redis, a Redis Cluster and in memory."""

from __future__ import annotations

import random
from typing import Any, cast

import orjson
import pytest
import redis

from streamrec.config import RedisStoreConfig
from streamrec.errors import FeatureStoreError, FeatureStoreUnavailable
from streamrec.features.schema import FeatureSchema, FeatureSpec, read_features
from streamrec.featurestore.profiles import MemoryProfileStore, ProfilePoint, ProfileStore, user_values
from streamrec.featurestore.redis_profiles import RedisProfileStore
from streamrec.local.ports import free_port
from tests.integration.conftest import PrivateService

T0 = 1_511_658_000_000
KEEP = 3


@pytest.fixture(params=["redis", "redis-cluster", "memory"])
def store(request: pytest.FixtureRequest, unique_name: str) -> ProfileStore:
    if request.param == "memory":
        return MemoryProfileStore(points=KEEP)
    if request.param == "redis-cluster":
        url = request.getfixturevalue("redis_cluster_url")
        return RedisProfileStore(RedisStoreConfig(url=url, cluster=True, key_prefix=unique_name), KEEP)
    return RedisProfileStore(request.getfixturevalue("store_config"), KEEP)


def at(seconds: int) -> int:
    return T0 + seconds * 1000


def tier(seconds: int, value: str, user: str = "u") -> ProfilePoint:
    return ProfilePoint(user, at(seconds), {"tier": value})


def as_of(store: ProfileStore, seconds: int, user: str = "u") -> dict[str, object]:
    return dict(user_values(store.profile(user), at(seconds)))


def test_a_sample_gets_the_newest_value_at_or_before_its_time(store: ProfileStore) -> None:
    store.update([tier(10, "silver"), tier(20, "gold")])
    assert as_of(store, 15) == {"tier": "silver"}
    assert as_of(store, 20) == {"tier": "gold"}  # at: the event's own value counts
    assert as_of(store, 99) == {"tier": "gold"}
    assert as_of(store, 9) == {}  # nothing yet: the default


def test_a_later_value_never_leaks_into_an_earlier_sample(store: ProfileStore) -> None:
    """The later value arrives first; the earlier one late: each sample still reads its own time."""
    store.update([tier(20, "gold")])
    assert as_of(store, 15) == {}  # not gold: gold is stamped later than the sample
    store.update([tier(10, "silver")])
    assert as_of(store, 15) == {"tier": "silver"}
    assert as_of(store, 19) == {"tier": "silver"} and as_of(store, 20) == {"tier": "gold"}


def test_the_update_returns_the_profiles_asked_for_with_its_changes(store: ProfileStore) -> None:
    got = store.update([tier(10, "silver"), tier(20, "gold", "v")], ["u", "nobody"])
    assert got == {"u": {"tier": ((at(10), "silver"),)}, "nobody": {}}


def test_arrival_order_does_not_matter(store: ProfileStore) -> None:
    points = [tier(s, v) for s, v in [(1, "a"), (2, "b"), (3, "a"), (4, "c"), (5, "c")]]
    shuffled = random.Random(7).sample(points, len(points))
    for point in shuffled:  # one by one, out of order
        store.update([point])
    reference = MemoryProfileStore(points=KEEP)
    reference.update(points)
    assert store.profile("u") == reference.profile("u") == {
        "tier": ((at(3), "a"), (at(4), "c"), (at(5), "c")),
    }


def test_a_redelivered_event_changes_nothing(store: ProfileStore) -> None:
    batch = [tier(10, "silver"), tier(20, "gold")]
    store.update(batch)
    before = store.profile("u")
    store.update(batch)
    store.update(batch[::-1])
    assert store.profile("u") == before


def test_equal_times_are_ordered_by_value_whatever_the_arrival(store: ProfileStore) -> None:
    store.update([tier(10, "silver"), tier(10, "gold")])
    store.update([tier(10, "bronze")])
    assert [v for _, v in store.profile("u")["tier"]] == ["bronze", "gold", "silver"]
    assert as_of(store, 10) == {"tier": "silver"}  # the greatest encoding wins a tie


def test_only_the_newest_points_are_kept_and_an_older_one_is_dropped(store: ProfileStore) -> None:
    store.update([tier(s, f"v{s}") for s in (1, 2, 3, 4, 5)])
    assert [ts for ts, _ in store.profile("u")["tier"]] == [at(3), at(4), at(5)]
    store.update([tier(2, "late")])  # older than every point kept: dropped
    assert [v for _, v in store.profile("u")["tier"]] == ["v3", "v4", "v5"]
    assert as_of(store, 2) == {}  # older than what is kept: the default, never v3 (later)
    store.update([tier(4, "late")])  # within the kept ones: the oldest goes
    assert [v for _, v in store.profile("u")["tier"]] == ["late", "v4", "v5"]  # a tie: by value
    assert as_of(store, 4) == {"tier": "v4"}


def test_features_and_users_are_independent_and_values_keep_their_kinds(store: ProfileStore) -> None:
    store.update([
        ProfilePoint("u", at(1), {"tier": "gold", "segments": ("a", "b"), "age": 31.0}),
        ProfilePoint("u", at(2), {"age": 32.5}),
        ProfilePoint("v", at(1), {"tier": "basic"}),
    ])
    assert as_of(store, 1) == {"tier": "gold", "segments": ("a", "b"), "age": 31.0}
    assert as_of(store, 3) == {"tier": "gold", "segments": ("a", "b"), "age": 32.5}
    assert as_of(store, 3, "v") == {"tier": "basic"}
    assert user_values(store.profile("u"), at(3), names={"age"}) == {"age": 32.5}


def test_random_streams_agree_with_the_memory_store(store: ProfileStore) -> None:
    rng = random.Random(28)
    reference = MemoryProfileStore(points=KEEP)
    for _ in range(30):
        batch = [
            ProfilePoint(user, at(rng.randrange(20)), {rng.choice(["tier", "age"]): rng.choice("abc")})
            for user in rng.choices("uvw", k=rng.randrange(1, 6))
        ]
        batch += rng.sample(batch, rng.randrange(len(batch) + 1))  # redelivered within the batch
        users = rng.sample("uvwx", 2)
        assert store.update(batch, users) == reference.update(batch, users)
    for user in "uvw":
        for seconds in range(-1, 21):
            assert as_of(store, seconds, user) == as_of(reference, seconds, user)


def test_a_bound_below_one_point_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one point"):
        MemoryProfileStore(points=0)


# Redis only: keys, TTL, commands, the wire form.


def test_redis_keeps_one_hash_tagged_key_per_user_with_a_ttl(
    store_config: RedisStoreConfig, redis_client: redis.Redis
) -> None:
    store = RedisProfileStore(store_config, KEEP)
    store.update([tier(10, "silver", "42"), tier(20, "gold", "42")])
    prefix = store_config.key_prefix
    keys = [k.decode() for k in cast(list[bytes], redis_client.keys(f"{prefix}:*"))]
    assert keys == [f"{prefix}:prof:{{42}}"]
    ttl_ms = store_config.ttl_s * 1000
    assert ttl_ms - 60_000 < redis_client.pttl(keys[0]) <= ttl_ms
    assert redis_client.hgetall(keys[0]) == {
        b"tier": f'{at(10)}\x1f"silver"\x1e{at(20)}\x1f"gold"'.encode(),
    }


def _writes(client: redis.Redis) -> int:
    stats = cast(dict[str, dict[str, int]], client.info("commandstats"))
    return sum(stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("hset", "pexpireat"))


def test_redis_writes_nothing_for_a_redelivered_batch(
    store_config: RedisStoreConfig, redis_client: redis.Redis
) -> None:
    store = RedisProfileStore(store_config, KEEP)
    batch = [tier(10, "silver"), tier(20, "gold"), tier(30, "gold", "v")]
    store.update(batch)
    before = _writes(redis_client)
    store.update(batch, ["u", "v"])
    store.update(batch[::-1])
    assert _writes(redis_client) == before


def test_redis_a_batch_is_one_round_trip(store_config: RedisStoreConfig, redis_client: redis.Redis) -> None:
    store = RedisProfileStore(store_config, KEEP)
    store.profile("warm")  # loads the script
    sent: list[int] = []
    real = redis.client.Pipeline.execute

    def counting(pipe: redis.client.Pipeline, raise_on_error: bool = True) -> list[object]:
        sent.append(len(pipe.command_stack))
        return cast(list[object], real(pipe, raise_on_error))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(redis.client.Pipeline, "execute", counting)
        got = store.update([tier(s, "x", f"u{s}") for s in range(600)], [f"u{s}" for s in range(600)])
    assert len(got) == 600 and got["u599"] == {"tier": ((at(599), "x"),)}
    assert sent == [3]  # one pipeline: 600 users in calls of 256


def test_redis_reloads_its_script_after_a_flush(
    store_config: RedisStoreConfig, redis_client: redis.Redis
) -> None:
    store = RedisProfileStore(store_config, KEEP)
    store.update([tier(10, "silver")])
    redis_client.script_flush()
    store.update([tier(20, "gold")])
    assert as_of(store, 25) == {"tier": "gold"}


def test_events_user_features_reach_redis_and_read_back_as_of_each_sample(
    store_config: RedisStoreConfig, redis_client: redis.Redis
) -> None:
    """Declared user features read from events' JSON, through the store, checked in Redis itself."""
    schema = FeatureSchema.of([
        FeatureSpec(name="tier", field="membership", role="user"),
        FeatureSpec(name="age_band", role="user"),
        FeatureSpec(name="device", role="context"),
    ])
    docs: list[dict[str, Any]] = [  # arriving out of order, one redelivered
        {"event_id": "e2", "user_id": "7", "ts": at(20), "membership": "gold", "device": "ios"},
        {"event_id": "e1", "user_id": "7", "ts": at(10), "membership": "silver", "age_band": "30-39"},
        {"event_id": "e3", "user_id": "7", "ts": at(30), "device": "web"},
        {"event_id": "e2", "user_id": "7", "ts": at(20), "membership": "gold", "device": "ios"},
    ]
    store = RedisProfileStore(store_config, KEEP)
    points = [ProfilePoint(d["user_id"], d["ts"], read_features(d, schema.role("user"))) for d in docs]
    profiles = store.update([p for p in points if p.values], ["7"])
    key = f"{store_config.key_prefix}:prof:{{7}}"
    stored = {k.decode(): v.decode() for k, v in cast(dict[bytes, bytes], redis_client.hgetall(key)).items()}
    assert stored == {
        "tier": f'{at(10)}\x1f"silver"\x1e{at(20)}\x1f"gold"',
        "age_band": f'{at(10)}\x1f"30-39"',
    }
    names = {f.name for f in schema.role("user")}
    samples = {d["event_id"]: user_values(profiles["7"], d["ts"], names) for d in docs}
    assert samples == {
        "e1": {"tier": "silver", "age_band": "30-39"},
        "e2": {"tier": "gold", "age_band": "30-39"},
        "e3": {"tier": "gold", "age_band": "30-39"},
    }
    assert orjson.loads(stored["tier"].split("\x1e")[0].split("\x1f")[1]) == "silver"


def test_a_least_privileged_redis_user_runs_the_profile_store(
    private_redis: PrivateService, unique_name: str
) -> None:
    """The command groups the deployment docs name are enough for the profile store too."""
    admin = redis.Redis(port=private_redis.port)
    admin.acl_setuser("app", enabled=True, passwords=["+secret"], keys=[f"{unique_name}:*"],
                      commands=["+@read", "+@write", "+@scripting", "+@fast"])
    url = f"redis://app:secret@127.0.0.1:{private_redis.port}"
    store = RedisProfileStore(RedisStoreConfig(url=url, key_prefix=unique_name), KEEP)
    store.update([tier(10, "silver"), tier(20, "gold")])
    assert as_of(store, 15) == {"tier": "silver"}


def test_a_cluster_profile_store_whose_cluster_is_down_is_unavailable_not_a_traceback(
    store_config: RedisStoreConfig, unique_name: str
) -> None:
    """The Cluster client connects as it is made, at the first update: a Cluster not up yet is
    an outage the consumers wait out (FeatureStoreUnavailable), not redis-py's own exception
    escaping past their retries; a plain Redis taken for a Cluster is told, not retried.
    """
    down = RedisProfileStore(RedisStoreConfig(url=f"redis://127.0.0.1:{free_port()}", cluster=True), KEEP)
    with pytest.raises(FeatureStoreUnavailable, match="STREAMREC_STORE__CLUSTER"):
        down.update([tier(10, "silver")])
    plain_cfg = RedisStoreConfig(url=store_config.url, cluster=True, key_prefix=unique_name)
    plain = RedisProfileStore(plain_cfg, KEEP)
    with pytest.raises(FeatureStoreError, match="Cluster mode is not enabled") as told:
        plain.update([tier(10, "silver")])
    assert not isinstance(told.value, FeatureStoreUnavailable)
