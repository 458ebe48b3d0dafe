"""One feature-store contract, run on Redis, a Redis Cluster and the in-memory store."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import cast

import pytest
import redis

from streamrec.config import RedisStoreConfig
from streamrec.errors import (
    FeatureStoreError,
    FeatureStoreLost,
    FeatureStoreUnavailable,
    FeatureStoreUnreachable,
)
from streamrec.events import Event
from streamrec.featurestore import (
    Arrival,
    Behaviour,
    FeatureStore,
    History,
    MemoryFeatureStore,
    RedisFeatureStore,
    StoreUpdate,
    Verdict,
)
from streamrec.featurestore.redis_markers import marker_keys
from streamrec.featurestore.redis_scripts import FIRST_SEEN_LUA
from streamrec.kafka.records import Partition
from streamrec.local.launch import start_redis
from streamrec.local.ports import free_port
from tests.integration.conftest import PrivateService, cluster_ports

T0 = 1_511_658_000_000
HOUR = 3_600_000


@pytest.fixture(params=["redis", "redis-cluster", "memory"])
def store(request: pytest.FixtureRequest, unique_name: str) -> FeatureStore:
    if request.param == "memory":
        return MemoryFeatureStore(length=3, dedup_horizon_ms=HOUR)
    if request.param == "redis-cluster":
        url = request.getfixturevalue("redis_cluster_url")
        return RedisFeatureStore(RedisStoreConfig(url=url, cluster=True, key_prefix=unique_name), 3, HOUR)
    cfg: RedisStoreConfig = request.getfixturevalue("store_config")
    return RedisFeatureStore(cfg, 3, HOUR)


def ev(i: int, user: str = "u", ts: int | None = None, item: str | None = None) -> Event:
    at = T0 + (i if ts is None else ts) * 1000
    return Event(f"e{i:03d}", user, item or f"i{i}", f"c{i % 2}", "pv", at)


def update(
    store: FeatureStore, events: Sequence[Event], wanted: Sequence[Event] = (), origin: str = "0"
) -> StoreUpdate:
    """Each event arrives from its own record (``<origin>:<event id>``): the same call again
    is a redo, another ``origin`` a resend.
    """
    return store.update([Arrival(e, f"{origin}:{e.event_id}", e in wanted) for e in events])


def items(history: History | None) -> list[str]:
    assert history is not None
    behaviours = list(history)
    assert history.items == tuple(b.item_id for b in behaviours)  # what samples carry
    assert history.categories == tuple(b.category_id for b in behaviours)
    return [b.item_id for b in behaviours]


def test_history_is_strictly_earlier_latest_first_capped(store: FeatureStore) -> None:
    events = [ev(i) for i in range(6)]
    histories = update(store, events, [events[0], events[2], events[5]]).histories
    assert [items(histories[i]) for i in (0, 2, 5)] == [[], ["i0", "i1"], ["i2", "i3", "i4"]]
    assert [histories[i] for i in (1, 3, 4)] == [None, None, None]  # not asked for
    assert [b.event_id for b in store.sequence("u")] == ["e003", "e004", "e005"]


def test_a_history_holds_each_behaviour_whole_oldest_first(store: FeatureStore) -> None:
    events = [ev(i) for i in range(4)]
    history = update(store, events, [events[3]]).histories[3]
    assert history is not None
    assert history.behaviours() == [Behaviour.of(e) for e in events[:3]]  # ids, times, actions
    assert history.items == ("i0", "i1", "i2") and history.categories == ("c0", "c1", "c0")


def test_equal_times_are_excluded_and_ordered_by_event_id(store: FeatureStore) -> None:
    events = [ev(2, ts=5), ev(1, ts=5), ev(0, ts=4)]
    history = update(store, events, [events[0]]).histories[0]
    assert history is not None and [b.event_id for b in history] == ["e000"]
    assert [b.event_id for b in store.sequence("u")] == ["e000", "e001", "e002"]


def test_events_at_one_time_read_one_history(store: FeatureStore) -> None:
    """A page of impressions: Redis reads the history once and answers the rest by reference."""
    update(store, [ev(1), ev(2)])
    page = [ev(i, ts=5) for i in (10, 11, 12, 13)]
    later = ev(20, "v", ts=5)  # another user at the same time reads its own
    got = update(store, [*page, ev(3, ts=4), later], [page[0], page[2], page[3], later]).histories
    assert [items(got[i]) for i in (0, 2, 3)] == [["i1", "i2", "i3"]] * 3
    assert got[1] is None and items(got[5]) == []


def test_a_redo_is_accepted_and_late_events_land_in_time_order(store: FeatureStore) -> None:
    update(store, [ev(1), ev(3)])
    again = update(store, [ev(1), ev(3), ev(2)])
    assert again.verdicts == [Verdict.ACCEPTED] * 3
    seq = store.sequence("u")
    assert [b.event_id for b in seq] == ["e001", "e002", "e003"]
    assert seq[0].category_id == "c1" and seq[0].action == "pv" and seq[0].ts == T0 + 1000


def test_a_redone_batch_reads_the_same_histories(store: FeatureStore) -> None:
    """A batch whose commit aborted runs again: the store must not have trimmed what it reads."""
    update(store, [ev(i) for i in range(5)])
    batch = [ev(i) for i in range(5, 10)]
    first = update(store, batch, batch).histories
    again = update(store, batch, batch).histories
    assert again == first
    assert items(first[0]) == ["i2", "i3", "i4"]
    assert [b.event_id for b in store.sequence("u")] == ["e007", "e008", "e009"]


def test_a_resent_event_is_a_duplicate_and_a_reused_id_a_conflict(store: FeatureStore) -> None:
    update(store, [ev(1), ev(2)])
    resent = update(store, [ev(1), ev(2, item="other")], [ev(1)], origin="1")
    assert resent.verdicts == [Verdict.DUPLICATE, Verdict.CONFLICT]
    assert resent.first_seen_at == ["0:e001", "0:e002"]
    assert resent.histories == [None, None]
    # an item seen is seen: the store learns it without waiting for the verdicts
    assert resent.first_seen == {"i1": T0 + 1000, "other": T0 + 2000}
    assert [b.item_id for b in store.sequence("u")] == ["i1", "i2"]  # nothing stored twice


def test_each_creation_of_the_events_topic_gets_origins_of_its_own(store: FeatureStore) -> None:
    """A topic created again starts its offsets over: its records must not pass for the old one's
    at the same place (a redone batch), so an event published again into it is a duplicate.
    """
    assert [store.events_topic(t) for t in ["A", "A", None, "B", "B", None, "A"]] == [
        "", "", "", "@2", "@2", "@2", "@3",
    ]
    first = store.update([Arrival(ev(1), "0:7")]).verdicts  # partition 0, offset 7 of topic A
    again = store.update([Arrival(ev(1), "0:7@3")]).verdicts  # the same place in A made again
    assert (first, again) == ([Verdict.ACCEPTED], [Verdict.DUPLICATE])


def test_an_arrival_not_stored_is_judged_and_reads_its_history_but_stays_out_of_the_sequence(
    store: FeatureStore,
) -> None:
    update(store, [ev(1), ev(2)])
    shown = ev(3)
    first = store.update([Arrival(shown, "0:3", wants_history=True, stored=False)])
    assert first.verdicts == [Verdict.ACCEPTED] and items(first.histories[0]) == ["i1", "i2"]
    again = store.update([Arrival(shown, "0:3", wants_history=True, stored=False)])  # a redo
    assert again.verdicts == [Verdict.ACCEPTED] and items(again.histories[0]) == ["i1", "i2"]
    resent = store.update([Arrival(shown, "1:3", stored=False)])
    assert resent.verdicts == [Verdict.DUPLICATE]
    update(store, [ev(4)])
    assert [b.item_id for b in store.sequence("u")] == ["i1", "i2", "i4"]


def test_within_a_batch_the_first_record_of_an_id_wins(store: FeatureStore) -> None:
    arrivals = [Arrival(ev(1), "0:1"), Arrival(ev(1), "0:2"), Arrival(ev(1, item="x"), "0:3")]
    assert store.update(arrivals).verdicts == [Verdict.ACCEPTED, Verdict.DUPLICATE, Verdict.CONFLICT]


def test_ids_are_forgotten_past_the_horizon(store: FeatureStore) -> None:
    update(store, [ev(1)])
    update(store, [ev(2, ts=2 * HOUR // 1000)])  # the user's newest is now 2 h later
    assert update(store, [ev(1)], origin="1").verdicts == [Verdict.ACCEPTED]  # forgotten
    assert update(store, [ev(2, ts=2 * HOUR // 1000)], origin="1").verdicts == [Verdict.DUPLICATE]


def test_a_forgotten_id_is_new_again_once_within_a_batch(store: FeatureStore) -> None:
    update(store, [ev(1)])
    update(store, [ev(2, ts=2 * HOUR // 1000)])
    again = store.update([Arrival(ev(1), "1:1"), Arrival(ev(1), "1:2"), Arrival(ev(1, item="x"), "1:3")])
    assert again.verdicts == [Verdict.ACCEPTED, Verdict.DUPLICATE, Verdict.CONFLICT]
    assert again.first_seen_at == ["", "1:1", "1:1"]


def test_ids_are_per_user(store: FeatureStore) -> None:
    result = store.update([Arrival(ev(1, user="a"), "0:1"), Arrival(ev(1, user="b"), "1:1")])
    assert result.verdicts == [Verdict.ACCEPTED, Verdict.ACCEPTED]


def test_first_seen_is_the_earliest_event_of_an_item_in_any_order(store: FeatureStore) -> None:
    first = update(store, [ev(5), Event("x", "v", "i5", "c", "pv", T0 + 3000)])
    assert first.first_seen == {"i5": T0 + 3000}
    later = update(store, [Event("y", "w", "i5", "c", "pv", T0 + 9000), ev(7)])
    assert later.first_seen == {"i5": T0 + 3000, "i7": T0 + 7000}
    late = update(store, [Event("z", "w", "i5", "c", "pv", T0 + 1000)])  # a late event
    assert late.first_seen == {"i5": T0 + 1000}


def test_a_store_that_lost_its_data_is_detected(
    store_config: RedisStoreConfig, redis_client: redis.Redis
) -> None:
    store = RedisFeatureStore(store_config, 3, HOUR)
    store.attach(can_start_empty=True)
    update(store, [ev(1)])
    redis_client.flushdb()  # what a restart without persistence leaves
    with pytest.raises(FeatureStoreLost, match="lost its data while consumers ran"):
        update(store, [ev(2)])
    with pytest.raises(FeatureStoreLost, match="rebuild"):
        RedisFeatureStore(store_config, 3, HOUR).attach(can_start_empty=False)
    store.reset_marker()
    RedisFeatureStore(store_config, 3, HOUR).attach(can_start_empty=False)


def test_a_cluster_store_keeps_a_marker_on_every_primary(
    redis_cluster_url: str, unique_name: str
) -> None:
    cfg = RedisStoreConfig(url=redis_cluster_url, cluster=True, key_prefix=unique_name)
    store = RedisFeatureStore(cfg, 3)
    keys = marker_keys(store._redis, unique_name)  # the layout is what this test checks
    assert len(keys) == 3
    store.attach(can_start_empty=True)
    update(store, [ev(1)])


def test_a_one_primary_cluster_store_attaches(
    service_binaries: tuple[str, str], tmp_path: Path, unique_name: str
) -> None:
    """A Cluster of one primary answers a command sent to all its primaries with one reply,
    not one per node: the store's server checks ask node by node.
    """
    port = cluster_ports("127.0.0.1", 1)[0]
    node = start_redis("127.0.0.1", port, tmp_path, extra_args=[
        "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
    ])
    try:
        client = redis.Redis(port=port)
        client.execute_command("CLUSTER ADDSLOTS", *range(16384))  # ADDSLOTSRANGE: 7.0+
        deadline = time.monotonic() + 30
        while client.cluster("INFO")["cluster_state"] != "ok":
            assert time.monotonic() < deadline, "the one-node cluster did not come up"
            time.sleep(0.05)
        cfg = RedisStoreConfig(url=f"redis://127.0.0.1:{port}", cluster=True, key_prefix=unique_name)
        store = RedisFeatureStore(cfg, 3, HOUR)
        store.attach(can_start_empty=True)
        assert items(update(store, [ev(1), ev(2)], [ev(2)]).histories[1]) == ["i1"]
    finally:
        node.stop()


def test_a_least_privileged_redis_user_runs_the_store(
    private_redis: PrivateService, unique_name: str
) -> None:
    """A user held to the store's keys and the command groups the README names (no INFO):
    attach skips the version check, and every script runs.
    """
    admin = redis.Redis(port=private_redis.port)
    admin.acl_setuser("app", enabled=True, passwords=["+secret"], keys=[f"{unique_name}:*"],
                      commands=["+@read", "+@write", "+@scripting", "+@fast"])
    url = f"redis://app:secret@127.0.0.1:{private_redis.port}"
    store = RedisFeatureStore(RedisStoreConfig(url=url, key_prefix=unique_name), 3, HOUR)
    with pytest.raises(redis.exceptions.NoPermissionError):
        redis.Redis.from_url(url).info("server")
    store.attach(can_start_empty=True)
    assert items(update(store, [ev(1), ev(2)], [ev(2)]).histories[1]) == ["i1"]
    partition = Partition("events", 0)  # and the partitions' scripts
    store.check_claims({partition: store.claim({partition: 0})[partition].epoch})
    assert store.events_topic("A") == ""  # and the events topic's key


@pytest.mark.parametrize("user", ["reader", "wrong-password"])
def test_a_redis_user_refused_is_told_at_once_not_retried_as_an_outage(
    private_redis: PrivateService, unique_name: str, user: str
) -> None:
    """A user that may not write, or a wrong password, is a setting to fix, not an outage to
    wait out: the store says what Redis refused and what the store needs, at once.
    """
    admin = redis.Redis(port=private_redis.port)
    admin.acl_setuser("reader", enabled=True, passwords=["+secret"], keys=["*"],
                      commands=["+@read", "+@fast"])
    password = "secret" if user == "reader" else "not-it"
    url = f"redis://reader:{password}@127.0.0.1:{private_redis.port}"
    store = RedisFeatureStore(RedisStoreConfig(url=url, key_prefix=unique_name), 3, HOUR)
    with pytest.raises(FeatureStoreError, match="redis refused user 'reader'") as refused:
        store.attach(can_start_empty=True)
    assert not isinstance(refused.value, FeatureStoreUnavailable)
    assert "@read, @write, @scripting and @fast" in str(refused.value)


def test_a_cluster_store_that_cannot_reach_its_cluster_waits_and_one_on_a_plain_redis_is_told(
    store_config: RedisStoreConfig, unique_name: str
) -> None:
    """The Cluster client connects when made: the store makes it when first used, so that a
    consumer started before its Cluster is up waits for it as for a standalone Redis never
    reached (STREAMREC_STORE__CONNECT_TIMEOUT_S), and one pointed at a Redis without Cluster
    mode hears so, instead of a traceback from the constructor.
    """
    down = RedisFeatureStore(RedisStoreConfig(url=f"redis://127.0.0.1:{free_port()}", cluster=True), 3)
    with pytest.raises(FeatureStoreUnreachable, match="did not answer"):
        down.attach(can_start_empty=True)
    plain = RedisFeatureStore(RedisStoreConfig(url=store_config.url, cluster=True, key_prefix=unique_name), 3)
    with pytest.raises(FeatureStoreError, match="Cluster mode is not enabled") as told:
        plain.attach(can_start_empty=True)
    assert not isinstance(told.value, FeatureStoreUnavailable)


@pytest.mark.parametrize(("maxmemory", "policy", "refused"), [
    ("64mb", "allkeys-lru", True),
    ("64mb", "volatile-ttl", True),  # every key of the store has a TTL
    ("64mb", "noeviction", False),
    ("0", "allkeys-lru", False),  # no limit: nothing is evicted
])
def test_a_redis_that_would_evict_the_stores_keys_is_refused(
    service_binaries: tuple[str, str], tmp_path: Path, unique_name: str,
    maxmemory: str, policy: str, refused: bool,
) -> None:
    """Under memory pressure an evicting Redis drops keys without a word: sequences cut
    short, ids forgotten (duplicates sent again), the join's windows gone (impressions never
    labelled). The store refuses one with a memory limit and any policy but noeviction.
    """
    port = free_port()
    server = start_redis("127.0.0.1", port, tmp_path, extra_args=[
        "--maxmemory", maxmemory, "--maxmemory-policy", policy,
    ])
    try:
        store = RedisFeatureStore(
            RedisStoreConfig(url=f"redis://127.0.0.1:{port}", key_prefix=unique_name), 3, HOUR
        )
        if refused:
            with pytest.raises(FeatureStoreError, match=f"maxmemory-policy {policy}.*noeviction"):
                store.attach(can_start_empty=True)
        else:
            store.attach(can_start_empty=True)
    finally:
        server.stop()


def test_a_redis_out_of_memory_stops_the_store_with_what_to_do(
    private_redis: PrivateService, unique_name: str
) -> None:
    admin = redis.Redis(port=private_redis.port)
    store = RedisFeatureStore(
        RedisStoreConfig(url=f"redis://127.0.0.1:{private_redis.port}", key_prefix=unique_name), 3, HOUR
    )
    store.attach(can_start_empty=True)
    admin.config_set("maxmemory", 1)  # below what it holds: every write is refused
    try:
        with pytest.raises(FeatureStoreError, match="out of memory.*maxmemory.*TTL_S") as told:
            update(store, [ev(1)])
        assert not isinstance(told.value, FeatureStoreUnavailable)
    finally:
        admin.config_set("maxmemory", 0)


def test_a_redis_busy_with_another_clients_script_is_an_outage_to_wait_out(
    private_redis: PrivateService, unique_name: str
) -> None:
    """While another client's script runs past the busy threshold, Redis answers every other
    command with BUSY until the script ends or is killed: passing, so the batch is redone
    after a backoff (an outage), not the consumer stopped.
    """
    admin = redis.Redis(port=private_redis.port)
    store = RedisFeatureStore(
        RedisStoreConfig(url=f"redis://127.0.0.1:{private_redis.port}", key_prefix=unique_name), 3, HOUR
    )
    store.attach(can_start_empty=True)
    admin.config_set("lua-time-limit", 100)
    blocker = threading.Thread(target=_run_forever, args=(private_redis.port,))
    blocker.start()
    try:
        deadline = time.monotonic() + 10
        while True:  # until Redis says BUSY
            try:
                admin.ping()
            except redis.exceptions.ResponseError:
                break
            assert time.monotonic() < deadline, "the blocking script did not make Redis busy"
            time.sleep(0.05)
        with pytest.raises(FeatureStoreUnavailable, match="BUSY"):
            update(store, [ev(1)])
    finally:
        admin.script_kill()
        blocker.join()
    assert items(update(store, [ev(1), ev(2)], [ev(2)]).histories[1]) == ["i1"]


def _run_forever(port: int) -> None:
    """A script that loops until SCRIPT KILL."""
    with contextlib.suppress(redis.exceptions.ResponseError):
        redis.Redis(port=port).eval("while true do end", 0)


def test_users_are_independent(store: FeatureStore) -> None:
    update(store, [ev(1, "a"), ev(2, "b")])
    assert [b.item_id for b in store.sequence("a")] == ["i1"]
    assert [b.item_id for b in store.sequence("b")] == ["i2"]
    assert store.sequence("nobody") == []


def test_redis_keys_are_hash_tagged_and_expire(
    store_config: RedisStoreConfig, redis_client: redis.Redis
) -> None:
    store = RedisFeatureStore(store_config, 3, HOUR)
    update(store, [ev(1, "42")])
    prefix = store_config.key_prefix
    keys = sorted(k.decode() for k in cast(list[bytes], redis_client.keys(f"{prefix}:*")))
    assert keys == [f"{prefix}:ids:{{42}}", f"{prefix}:item:{{i1}}", f"{prefix}:seq:{{42}}"]
    ttl_ms = store_config.ttl_s * 1000
    for key in keys:  # the scripts set absolute times (PXAT): from now, in milliseconds
        assert ttl_ms - 60_000 < redis_client.pttl(key) <= ttl_ms


def test_redis_reloads_its_scripts_after_a_flush(
    store_config: RedisStoreConfig, redis_client: redis.Redis
) -> None:
    store = RedisFeatureStore(store_config, 3, HOUR)
    update(store, [ev(1)])
    redis_client.script_flush()  # as after a restart or a failover
    assert items(update(store, [ev(2)], [ev(2)]).histories[0]) == ["i1"]


def test_work_overlapped_with_an_update_runs_once(
    store: FeatureStore, request: pytest.FixtureRequest
) -> None:
    runs: list[int] = []
    store.update([Arrival(ev(1), "0:e001", False)], lambda: runs.append(1))
    if request.node.callspec.params["store"] == "redis":  # the scripts go again; the work does not
        request.getfixturevalue("redis_client").script_flush()
    got = store.update([Arrival(ev(2), "0:e002", True)], lambda: runs.append(2))
    assert runs == [1, 2]
    assert items(got.histories[0]) == ["i1"]


def test_redis_drops_a_connection_left_with_replies_unread(
    store_config: RedisStoreConfig, redis_client: redis.Redis
) -> None:
    """Commands go out before their replies are read: a round trip cut short (here by the
    work overlapped with it) must not leave its replies for the next one to read.
    """
    store = RedisFeatureStore(store_config, 3, HOUR)

    def fail() -> None:
        raise RuntimeError("cut short")

    with pytest.raises(RuntimeError):
        store.update([Arrival(ev(1), "0:e001", False)], fail)
    got = update(store, [ev(2), ev(1)], [ev(2)])  # ev(1) arrived above: the same record again
    assert got.verdicts == [Verdict.ACCEPTED, Verdict.ACCEPTED]
    assert items(got.histories[0]) == ["i1"]
    assert update(store, [ev(1)], origin="1").verdicts == [Verdict.DUPLICATE]


def _many_users(n: int) -> list[Arrival]:
    """One wanted event each for ``n`` users: a few user calls' worth."""
    return [Arrival(ev(i, user=f"u{i}"), f"0:{i}", True) for i in range(n)]


def _in_use(store: RedisFeatureStore) -> int:
    """Connections of the store's pool taken and not given back."""
    client = cast(redis.Redis, store._redis)  # noqa: SLF001 - what a leak would show
    return len(client.connection_pool._in_use_connections)  # noqa: SLF001


def test_redis_hands_out_answers_before_the_last_call_is_read(store_config: RedisStoreConfig) -> None:
    """The first answers come while later user calls' replies are still unread (samples are
    built meanwhile); the connection goes back to the pool once the last one is read.
    """
    store = RedisFeatureStore(store_config, 3, HOUR)
    with store.update(_many_users(1_000)) as got:
        answers = got.answers()
        assert next(answers)[0] is Verdict.ACCEPTED
        assert _in_use(store) == 1  # replies still to come on it
        assert len(list(answers)) == 999
        assert _in_use(store) == 0
    assert got.first_seen == {f"i{i}": T0 + i * 1000 for i in range(1_000)}


def test_redis_gives_back_the_connection_of_an_empty_update(store_config: RedisStoreConfig) -> None:
    """A batch of nothing but dead letters, or a rebuild's empty poll, before any marker is
    known: no command goes out, and no connection stays taken.
    """
    store = RedisFeatureStore(store_config, 3, HOUR)
    for _ in range(3):
        assert store.update([]).all() == []
        update(store, [ev(1)]).all()
    assert _in_use(store) == 0


def test_redis_drops_a_connection_whose_answers_were_left_unread(
    store_config: RedisStoreConfig,
) -> None:
    """An update given up half read (the batch failed meanwhile) gives its connection back
    dropped: the next update must not read the replies it left.
    """
    store = RedisFeatureStore(store_config, 3, HOUR)
    with store.update(_many_users(1_000)) as given_up:
        next(given_up.answers())
    assert _in_use(store) == 0
    redo = store.update(_many_users(1_000))  # the batch again: its own records
    assert redo.verdicts == [Verdict.ACCEPTED] * 1_000
    assert redo.first_seen_at == [""] * 1_000


def test_redis_fails_an_update_whose_later_call_fails(
    store_config: RedisStoreConfig, redis_client: redis.Redis
) -> None:
    """A user call failing after the first answers went out fails the update there, as the
    store's error, and leaves the store usable.
    """
    store = RedisFeatureStore(store_config, 3, HOUR)
    redis_client.set(store.key("u900"), "not a sorted set")  # its call fails (WRONGTYPE)
    with store.update(_many_users(1_000)) as got:
        answers = got.answers()
        assert next(answers)[0] is Verdict.ACCEPTED
        with pytest.raises(FeatureStoreError, match="WRONGTYPE"):
            list(answers)
    assert _in_use(store) == 0
    assert update(store, [ev(1, user="v")]).verdicts == [Verdict.ACCEPTED]


def test_redis_scripts_lost_after_the_first_calls_make_the_batch_go_again(
    store_config: RedisStoreConfig, redis_client: redis.Redis
) -> None:
    """Scripts lost between the item calls and the user calls (a failover mid-batch): the
    update fails as unavailable (the consumer redoes the batch), and the redo reloads them.
    """
    store = RedisFeatureStore(store_config, 3, HOUR)
    update(store, [ev(1)])
    redis_client.script_flush()
    redis_client.script_load(FIRST_SEEN_LUA)  # the item calls run; the user calls do not
    with store.update([Arrival(ev(2), "0:e002", True)]) as got, pytest.raises(FeatureStoreUnavailable):
        got.all()
    redo = store.update([Arrival(ev(2), "0:e002", True)])
    assert items(redo.histories[0]) == ["i1"]


def random_batches(seed: int) -> Iterator[tuple[int, list[Arrival], int]]:
    """Random batches of six users' events: resends, reused ids, late events, hours going by.

    Each as its number, its arrivals and how many times it runs (twice: redone after an abort).
    """
    rng = random.Random(seed)
    sent: list[Event] = []
    for batch_no in range(40):
        arrivals = []
        for k in range(rng.randint(1, 30)):
            roll = rng.random()
            if sent and roll < 0.15:  # a resend, from another record
                event, origin = rng.choice(sent), f"9:{batch_no}.{k}"
            elif sent and roll < 0.2:  # an id reused for other content
                old = rng.choice(sent)
                event, origin = Event(old.event_id, old.user_id, "other", "c", "pv", old.ts), f"8:{k}"
            else:
                at = batch_no * 600 + rng.randint(-900, 60)  # late ones too; hours go by
                event = Event(f"e{batch_no}.{k}", f"u{rng.randint(0, 5)}", f"i{rng.randint(0, 40)}",
                              "c", "pv", T0 + at * 1000)
                sent.append(event)
                origin = f"0:{batch_no}.{k}"
            arrivals.append(Arrival(event, origin, rng.random() < 0.7))
        yield batch_no, arrivals, 2 if rng.random() < 0.3 else 1


@pytest.mark.parametrize("cluster", [False, True], ids=["redis", "redis-cluster"])
def test_redis_answers_as_the_memory_store_on_a_random_stream(
    cluster: bool, request: pytest.FixtureRequest, unique_name: str
) -> None:
    """Resends, reused ids, redone batches, late events, long histories past the cap and
    ids past the horizon, in random batches: Redis answers every update as memory does.
    """
    if cluster:
        cfg = RedisStoreConfig(url=request.getfixturevalue("redis_cluster_url"), cluster=True,
                               key_prefix=unique_name)
    else:
        cfg = request.getfixturevalue("store_config")
    stores: list[FeatureStore] = [RedisFeatureStore(cfg, 4, HOUR), MemoryFeatureStore(4, HOUR)]
    for batch_no, arrivals, times in random_batches(7):
        for _ in range(times):
            redis_update, memory_update = (store.update(arrivals) for store in stores)
            assert redis_update.first_seen == memory_update.first_seen, batch_no
            assert redis_update.all() == memory_update.all(), batch_no
    for user in (f"u{i}" for i in range(6)):
        assert stores[0].sequence(user) == stores[1].sequence(user)


def test_redis_deletes_forgotten_ids_once_the_newest_crosses_a_horizon(
    store_config: RedisStoreConfig, redis_client: redis.Redis
) -> None:
    """Forgetting is exact at once; the ids themselves go when the user's newest event passes
    a multiple of the horizon, so none stays in Redis longer than two horizons.
    """
    store = RedisFeatureStore(store_config, 3, HOUR)
    key = f"{store_config.key_prefix}:ids:{{u}}"

    def at(hours: float) -> int:  # ev() takes seconds after T0, which is on a whole hour
        return round(hours * HOUR / 1000)

    update(store, [ev(1), ev(2, ts=at(0.5)), ev(3, ts=at(0.9))])
    update(store, [ev(4, ts=at(1.6))])  # the newest crosses 1 h: ids before 0.6 h go
    assert sorted(cast(list[bytes], redis_client.hkeys(key))) == [b"e003", b"e004"]
    update(store, [ev(5, ts=at(1.95))])  # e003 is now forgotten, though still in Redis
    assert sorted(cast(list[bytes], redis_client.hkeys(key))) == [b"e003", b"e004", b"e005"]
    assert update(store, [ev(3, ts=at(0.9))], origin="1").verdicts == [Verdict.ACCEPTED]


def test_redis_reads_ids_remembered_without_their_time(
    store_config: RedisStoreConfig, redis_client: redis.Redis
) -> None:
    """Ids written before the time was kept with them: the same record is a redo, another a
    resend.
    """
    store = RedisFeatureStore(store_config, 3, HOUR)
    arrival = Arrival(ev(1), "0:7")
    redis_client.hset(f"{store_config.key_prefix}:ids:{{u}}", "e001", arrival.mark)
    assert store.update([arrival, Arrival(ev(1), "0:8")]).verdicts == [Verdict.ACCEPTED, Verdict.DUPLICATE]
