"""The feature-store contract for declared behaviour features, on Redis and the in-memory store.

A behaviour is stored with its values of the declared behaviour features (outcomes
included), and a history returns each one along it, aligned with its items.
"""

from __future__ import annotations

import pytest
import redis

from streamrec.config import RedisStoreConfig
from streamrec.errors import SchemaChange
from streamrec.events import Event
from streamrec.features.schema import FeatureSchema, FeatureSpec, Value
from streamrec.featurestore import Arrival, FeatureStore, MemoryFeatureStore, RedisFeatureStore
from tests.integration.conftest import PrivateService

T0 = 1_511_658_000_000
HOUR = 3_600_000
SCHEMA = FeatureSchema.of([
    FeatureSpec(name="shop"),
    FeatureSpec(name="tags", kind="ids", max_ids=3),
    FeatureSpec(name="device", role="context"),  # not stored: a property of the moment
    FeatureSpec(name="price", kind="number"),
    FeatureSpec(name="rating", kind="number", outcome=True),
])
STORED = ("shop", "tags", "price", "rating")


@pytest.fixture(params=["redis", "memory"])
def store(request: pytest.FixtureRequest) -> FeatureStore:
    if request.param == "memory":
        return MemoryFeatureStore(length=3, dedup_horizon_ms=HOUR, schema=SCHEMA)
    cfg: RedisStoreConfig = request.getfixturevalue("store_config")
    return RedisFeatureStore(cfg, 3, HOUR, schema=SCHEMA)


def ev(i: int, **features: Value) -> Event:
    return Event(f"e{i}", "u", f"i{i}", "c", "pv", T0 + i * 1000, features=features)


def test_each_behaviour_feature_comes_back_along_the_history_in_time_order(store: FeatureStore) -> None:
    events = [
        ev(0, shop="s0", tags=("a", "b"), price=2.5, rating=4.0, device="ios"),
        ev(1, shop="s1", tags=(), price=10.0),  # no rating, no ids: None and ()
        ev(2, tags=("c",), rating=0.5),
        ev(3, shop="s3"),
    ]
    update = store.update([Arrival(e, f"0:{k}", wants_history=True) for k, e in enumerate(events)])
    last = update.histories[-1]
    assert last is not None and last.items == ("i0", "i1", "i2")
    assert dict(last.features) == {
        "shop": ("s0", "s1", None),
        "tags": (("a", "b"), (), ("c",)),
        "price": (2.5, 10.0, None),
        "rating": (4.0, None, 0.5),
    }
    first = update.histories[0]
    assert first is not None and not first.features  # nothing before it
    stored = store.sequence("u")
    assert [b.values(store.behaviour_features) for b in stored][-1] == ("s3", None, None, None)
    assert [b.action for b in stored] == ["pv"] * 3  # the action itself, values apart


def test_numbers_and_ids_keep_their_values(store: FeatureStore) -> None:
    odd = ev(0, shop="x" * 128, tags=("é", "1 2", "-"), price=-0.1, rating=1e-300)
    later = ev(1)
    update = store.update([Arrival(odd, "0:0"), Arrival(later, "0:1", wants_history=True)])
    history = update.histories[1]
    assert history is not None
    assert [history.features[name][0] for name in STORED] == ["x" * 128, ("é", "1 2", "-"), -0.1, 1e-300]


def test_behaviours_stored_before_the_features_were_declared_read_none(
    store_config: RedisStoreConfig,
) -> None:
    before = RedisFeatureStore(store_config, 3, HOUR)
    before.update([Arrival(Event("e0", "u", "i0", "c", "pv", T0), "0:0")])
    after = RedisFeatureStore(store_config, 3, HOUR, schema=SCHEMA)
    answer = after.update([Arrival(ev(1, shop="s1"), "0:1", wants_history=True)]).histories[0]
    assert answer is not None and answer.items == ("i0",)
    assert dict(answer.features) == {name: (None,) for name in STORED}
    assert [b.values(after.behaviour_features)[0] for b in after.sequence("u")] == [None, "s1"]


def test_the_default_schema_writes_the_members_it_always_wrote(
    store_config: RedisStoreConfig, redis_client: redis.Redis
) -> None:
    plain = RedisFeatureStore(store_config, 3, HOUR)
    plain.update([Arrival(ev(0, shop="s0"), "0:0")])  # features the schema does not declare
    assert redis_client.zrange(plain.key("u"), 0, -1) == [b"e0\ti0\tc\tpv"]
    featured = RedisFeatureStore(store_config, 3, HOUR, schema=SCHEMA)
    featured.update([Arrival(ev(1, shop="s1", tags=("a", "b"), price=3.0), "0:1")])
    assert redis_client.zrange(plain.key("u"), 1, 1) == [b"e1\ti1\tc\tpv\x1ds1\x1da\x1eb\x1d3\x1d"]


def test_a_featured_store_raises_the_member_limit_so_long_entries_stay_compact(
    private_redis: PrivateService, unique_name: str
) -> None:
    client = redis.Redis(port=private_redis.port)
    assert client.config_get("zset-max-listpack-value") == {"zset-max-listpack-value": "64"}
    cfg = RedisStoreConfig(url=f"redis://127.0.0.1:{private_redis.port}", key_prefix=unique_name)
    store = RedisFeatureStore(cfg, 50, HOUR, schema=SCHEMA)
    tags = ("tag-0000001", "tag-0000002", "tag-0000003")
    store.update([Arrival(ev(i, shop="shop-000042", tags=tags, price=1234.5), f"0:{i}") for i in range(50)])
    key = store.key("u")
    assert max(map(len, client.zrange(key, 0, -1))) > 64
    assert client.config_get("zset-max-listpack-value") == {"zset-max-listpack-value": "128"}
    assert client.object("encoding", key) == b"listpack"


def test_a_user_that_may_not_raise_the_limit_is_told_what_to_set(
    private_redis: PrivateService, unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    admin = redis.Redis(port=private_redis.port)
    admin.acl_setuser("app", enabled=True, passwords=["+secret"], keys=[f"{unique_name}:*"],
                      commands=["+@read", "+@write", "+@scripting", "+@fast"])
    url = f"redis://app:secret@127.0.0.1:{private_redis.port}"
    store = RedisFeatureStore(RedisStoreConfig(url=url, key_prefix=unique_name), 3, HOUR, schema=SCHEMA)
    with caplog.at_level("WARNING", logger="streamrec.featurestore"):
        store.update([Arrival(ev(0, shop="s"), "0:0")])
    assert "set it to at least 128 on the server" in caplog.text
    assert admin.config_get("zset-max-listpack-value") == {"zset-max-listpack-value": "64"}


def test_a_store_refuses_behaviour_features_declared_out_of_the_stored_order(
    store_config: RedisStoreConfig,
) -> None:
    RedisFeatureStore(store_config, 3, HOUR, schema=SCHEMA).attach(can_start_empty=True)
    RedisFeatureStore(store_config, 3, HOUR).attach(can_start_empty=True)  # features dropped: ignored
    added = FeatureSchema((*SCHEMA.features, FeatureSpec(name="brand")))
    RedisFeatureStore(store_config, 3, HOUR, schema=added).attach(can_start_empty=True)  # one more at the end
    inserted = FeatureSchema.of([FeatureSpec(name="brand"), *SCHEMA.extras])
    stored = r"holds behaviour features \['shop', 'tags', 'price', 'rating', 'brand'\]"
    with pytest.raises(SchemaChange, match=stored):
        RedisFeatureStore(store_config, 3, HOUR, schema=inserted).attach(can_start_empty=True)


@pytest.mark.parametrize("kind", ["number", "id"])
def test_a_store_refuses_a_behaviour_feature_declared_as_another_kind(
    store_config: RedisStoreConfig, kind: str
) -> None:
    # Found by a tour of docs/your-features.md: `genres` stored as ids, then declared a number,
    # crashed the consumers with a traceback (ValueError: could not convert string to float:
    # 'crime') on the next history read; declared an id, each history's lists came back as one id
    # joined by the store's separator ('action\x1ecrime'), silently. The store records each
    # stored feature's kind and refuses another in one line, as the learner refuses the snapshot.
    store = RedisFeatureStore(store_config, 3, HOUR, schema=SCHEMA)
    store.attach(can_start_empty=True)
    store.update([Arrival(ev(0, shop="s0", tags=("a", "b"), price=2.5), "0:0")])
    other = FeatureSchema.of([
        spec.model_copy(update={"kind": kind, "max_ids": 8}) if spec.name == "tags" else spec
        for spec in SCHEMA.extras
    ])
    changed = RedisFeatureStore(store_config, 3, HOUR, schema=other)
    with pytest.raises(SchemaChange, match=f"feature 'tags' of kind ids, and it is declared {kind}"):
        changed.attach(can_start_empty=True)
    RedisFeatureStore(store_config, 3, HOUR, schema=SCHEMA).attach(can_start_empty=True)  # as before: fine
