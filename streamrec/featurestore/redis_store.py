r"""Redis feature store: one sorted set per user, scored by event time.

Keys per user, hash-tagged ``{<user_id>}`` so they share one Cluster slot:

- ``<prefix>:seq:{u}``: the sequence, a sorted set scored by event time; member
  ``event_id \t item \t category \t action`` (see `Behaviour`);
- ``<prefix>:ids:{u}``: a hash, event id -> ``fingerprint \t partition:offset \t ts``: what
  arrived under each id, from which record and when, for the dedup horizon (an id older than
  the horizon behind the user's newest event counts as forgotten at once, and is deleted when
  the newest event next passes a multiple of the horizon).

Per item, ``<prefix>:item:{<item_id>}`` holds the first time it was seen.

A batch is one pipelined round trip of Lua script calls, each carrying a thousand items
(keep the earliest time; first, for every arrival) or a few hundred users (ZADD their
events, read each asked-for history with an exclusive time bound, trim what no redo of the
batch can need, refresh the TTLs). Each call is atomic, and on Redis Cluster
(``RedisStoreConfig.cluster``) carries only users (or items) of one slot, as a script's keys
must. A user's events travel as one string and the answers come back as one flat list of
strings: redis-py spends its time per argument and per reply element, not per byte
(``bench/consumer_throughput.py``). On a standalone Redis a round trip is streamed on one
connection: each call is sent as soon as it is built, and each user call's reply is parsed
when the caller first needs one of its answers, so a consumer builds the samples of the
first users while Redis runs the calls of the later ones; a round trip cut short drops its
connection rather than leave replies unread on it.

Its parts, a job each: ``redis_scripts`` (the Lua), ``redis_codec`` (events packed for the
sequence script, its answers parsed), ``redis_connection`` (the client, the scripts loaded,
a pipelined round trip, Redis's failures as the store's), ``redis_replies`` (a round trip's
replies read as they come), ``redis_server`` (the server's checks and limits, its failures
told apart) and ``redis_markers`` (the markers that tell a store that lost its data).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

import orjson
import redis
from redis.cluster import RedisCluster

from streamrec.config import RedisStoreConfig
from streamrec.errors import FeatureStoreError, FeatureStoreLost, PartitionFenced, SchemaChange
from streamrec.features.schema import FeatureSchema
from streamrec.featurestore.base import (
    Answer,
    Arrival,
    Behaviour,
    FeatureStore,
    StoreUpdate,
    earliest_per_item,
    users_of,
)
from streamrec.featurestore.partitions import (
    FENCED_ADVICE,
    Claim,
    PartitionBatch,
    PartitionOutcome,
    fenced_reason,
    lost_reason,
)
from streamrec.featurestore.redis_codec import FRESH, event_line, event_line_with, parse_call
from streamrec.featurestore.redis_connection import RedisConnection
from streamrec.featurestore.redis_markers import check_markers, marker_keys, new_marker
from streamrec.featurestore.redis_partitions import advance_args, parse_advance, parse_claim, partition_keys
from streamrec.featurestore.redis_replies import Replies
from streamrec.featurestore.redis_server import check_servers, server_infos
from streamrec.kafka.records import Partition

logger = logging.getLogger(__name__)

# Users (and items) per script call: one call per user cost most of the consumer's time in
# redis-py packing and parsing; a few hundred per call keep each call to a millisecond or
# so, short enough not to hold up other clients of Redis.
_USERS_PER_CALL = 256
_ITEMS_PER_CALL = 1_000


class RedisFeatureStore(FeatureStore):
    """Length-capped, TTL'd behaviour sequences in Redis (standalone or Cluster-safe keys)."""

    def __init__(
        self,
        cfg: RedisStoreConfig,
        length: int,
        dedup_horizon_ms: int = 6 * 3_600_000,
        client: redis.Redis | None = None,
        schema: FeatureSchema | None = None,
    ) -> None:
        """Connect to ``cfg.url`` (a Cluster when ``cfg.cluster``), or use ``client``.

        A Cluster client connects as it is made (to read the slots), so it is made when the
        store is first used: a consumer started before its Cluster is up then waits for it
        in `attach`, as for a standalone Redis.
        """
        super().__init__(length, dedup_horizon_ms, schema)
        self._prefix = cfg.key_prefix
        self._ttl_ms = cfg.ttl_s * 1000
        self._conn = RedisConnection(cfg, length, bool(self.behaviour_features), client)
        self._markers: dict[str, str] | None = None  # marker key -> value, set by attach()

    @property
    def _redis(self) -> redis.Redis | RedisCluster:
        """The client (`RedisConnection.client`)."""
        return self._conn.client

    def close(self) -> None:
        """Close the Redis client the store made and its connections (a client given stays open).

        Safe to call more than once; the store connects again if used after it.
        """
        self._conn.close()

    def key(self, user_id: str) -> str:
        """The sorted-set key of a user's sequence."""
        return f"{self._prefix}:seq:{{{user_id}}}"

    def item_key(self, item_id: str) -> str:
        """The key holding an item's first-seen time."""
        return f"{self._prefix}:item:{{{item_id}}}"

    def attach(self, can_start_empty: bool) -> None:
        """See `FeatureStore.attach`.

        The marker is one key per primary (on a Cluster, keys whose slots each primary
        serves), so a node that restarts empty is noticed too.
        """
        keys = marker_keys(self._redis, self._prefix)  # makes a Cluster's client, or says why it cannot
        try:
            check_servers(server_infos(self._redis))
            self._conn.answered = True
            self._check_features()
            values = [self._redis.get(key) for key in keys]
            if not any(values) and can_start_empty:
                value = new_marker()
                for key in keys:
                    self._redis.set(key, value, nx=True)
                values = [self._redis.get(key) for key in keys]
        except redis.RedisError as exc:
            raise self._conn.translated(exc) from exc
        if not all(values):
            raise FeatureStoreLost(
                f"the feature store at prefix {self._prefix!r} has lost its data (no marker; "
                "Redis restarted without persistence?), while events were processed before: "
                "stop the consumers and run `streamrec consumers rebuild`"
            )
        self._markers = {key: str(value) for key, value in zip(keys, values, strict=True)}
        marker = next(iter(self._markers.values()))
        logger.info("feature store attached prefix=%s marker=%r", self._prefix, marker)

    def _check_features(self) -> None:
        """Refuse behaviour features declared in another order than the stored entries hold them.

        A behaviour's values are stored by position (`streamrec.featurestore.values`):
        ``<prefix>:features`` records the longest list of names the entries were written with,
        and the declared list must extend it, or be a start of it (a feature dropped from the
        end: its stored values are ignored).

        Raises:
            SchemaChange: a feature declared in the middle, renamed or removed before another.
        """
        key = f"{self._prefix}:features"
        names = [spec.name for spec in self.behaviour_features]
        raw = self._redis.get(key)
        stored: list[str] = orjson.loads(raw) if raw else []
        if names[: len(stored)] != stored[: len(names)]:
            raise SchemaChange(
                f"the feature store at prefix {self._prefix!r} holds behaviour features {stored} by "
                f"position, and {names} are declared: declare them in that order with new ones at "
                "the end (STREAMREC_FEATURES), or rebuild the store (`streamrec consumers rebuild`)"
            )
        if len(names) > len(stored):
            self._redis.set(key, orjson.dumps(names))
        self._check_kinds()

    def _check_kinds(self) -> None:
        """Refuse a behaviour feature declared as another kind than its stored values were written as.

        A value is stored as text and read back by its declared kind: ids stored read as a
        number would fail to parse, and as an id would come back joined by the separator.
        ``<prefix>:feature-kinds`` records each stored feature's kind (a store from before it
        records them as it attaches).

        Raises:
            SchemaChange: a feature's kind differs from the stored one.
        """
        key = f"{self._prefix}:feature-kinds"
        raw = self._redis.get(key)
        stored: dict[str, str] = orjson.loads(raw) if raw else {}
        declared = {spec.name: spec.kind for spec in self.behaviour_features}
        for name, kind in declared.items():
            if stored.get(name, kind) != kind:
                raise SchemaChange(
                    f"the feature store at prefix {self._prefix!r} holds behaviour feature {name!r} of kind "
                    f"{stored[name]}, and it is declared {kind}: declare it as before, or declare the new "
                    "meaning under a new name at the end (STREAMREC_FEATURES)"
                )
        if not declared.items() <= stored.items():
            self._redis.set(key, orjson.dumps(stored | declared))

    def _stored_events_topic(self) -> str | None:
        """``<prefix>:events-topic`` (see `FeatureStore.events_topic`)."""
        try:
            raw = self._redis.get(f"{self._prefix}:events-topic")
        except redis.RedisError as exc:
            raise self._conn.translated(exc) from exc
        return None if raw is None else str(raw)

    def _store_events_topic(self, value: str) -> None:
        try:
            self._redis.set(f"{self._prefix}:events-topic", value)
        except redis.RedisError as exc:
            raise self._conn.translated(exc) from exc

    def reset_marker(self) -> None:
        """See `FeatureStore.reset_marker`."""
        value = new_marker(rebuilt=True)
        try:
            for key in marker_keys(self._redis, self._prefix):
                self._redis.set(key, value)
        except redis.RedisError as exc:
            raise FeatureStoreError(f"cannot write the store marker: {exc}") from exc
        self._markers = None

    def update(self, arrivals: Sequence[Arrival], meanwhile: Callable[[], None] | None = None) -> StoreUpdate:
        """See `FeatureStore.update`.

        One round trip: the markers, the items' first-seen calls, then the users' calls.
        ``first_seen`` is read before the update is returned; the answers are parsed as the
        caller asks for them, each user call's reply as it arrives, while Redis runs the
        later calls.

        Raises:
            FeatureStoreLost: the markers `attach` found are gone: Redis lost its data.
        """
        by_user: dict[str, list[int]] = defaultdict(list)  # user -> indexes into arrivals
        try:
            for index, arrival in enumerate(arrivals):
                by_user[arrival.event.user_id].append(index)
        except (AttributeError, TypeError):
            users_of(arrivals)  # the TypeError naming what update takes, if that is what failed
            raise
        calls = self._calls(list(by_user), self.key)
        earliest = earliest_per_item(a.event for a in arrivals)
        item_calls = self._calls(list(earliest), self.item_key, _ITEMS_PER_CALL)
        markers = list(self._markers or {})

        def commands(shas: tuple[str, ...]) -> Iterator[tuple[Any, ...]]:
            for key in markers:  # first: read what the batch is checked against
                yield ("GET", key)
            yield from self._item_commands(shas[1], earliest, item_calls)
            yield from self._user_commands(shas[0], arrivals, by_user, calls)

        def first_seen(replies: Iterator[Any]) -> dict[str, int]:
            check_markers(self._markers, [next(replies) for _ in markers], self._prefix)
            seen: dict[str, int] = {}
            for items in item_calls:
                seen.update(zip(items, map(int, next(replies)), strict=True))
            return seen

        seen, replies = self._conn.open(commands, first_seen, meanwhile)
        answers = self._answers(replies, arrivals, by_user, calls)
        return StoreUpdate(seen, answers, replies.close)

    def _answers(
        self,
        replies: Replies,
        arrivals: Sequence[Arrival],
        by_user: dict[str, list[int]],
        calls: list[list[str]],
    ) -> Iterator[Answer]:
        """Each arrival's answer in arrival order, parsed as needed.

        Each arrival's answer in arrival order, parsing a user call's reply when the first
        arrival that needs it comes: users are called in the order of their first arrival, so
        the first answers are out while Redis still runs the later calls.
        """
        call_of = {user: k for k, users in enumerate(calls) for user in users}
        answers: list[Answer] = [FRESH] * len(arrivals)
        parsed = 0
        try:
            for index, arrival in enumerate(arrivals):
                need = call_of[arrival.event.user_id]
                while parsed <= need:
                    users, reply = calls[parsed], self._conn.next_reply(replies)
                    expected = sum(len(by_user[user]) for user in users)
                    if len(reply) != expected:
                        raise FeatureStoreError(f"redis answered {len(reply)} verdicts for {expected} events")
                    parse_call(iter(reply), users, by_user, arrivals, answers, self.behaviour_features)
                    parsed += 1
                yield answers[index]
        except BaseException:  # a failure, or the answers given up: no replies left on the connection
            replies.close()
            raise
        replies.close()  # given back, if the last reply did not already (a batch with no users)

    def _calls(
        self, names: list[str], key: Callable[[str], str], per_call: int = _USERS_PER_CALL
    ) -> list[list[str]]:
        """Split users (or items) into script calls.

        A few hundred per call, and on a Cluster only names whose keys share a slot (a script's
        keys must).
        """
        if isinstance(self._redis, RedisCluster):
            by_slot: dict[int, list[str]] = defaultdict(list)
            for name in names:
                by_slot[self._redis.keyslot(key(name))].append(name)
            groups = list(by_slot.values())
        else:
            groups = [names]
        return [group[i : i + per_call] for group in groups for i in range(0, len(group), per_call)]

    def _user_commands(
        self,
        sha: str,
        arrivals: Sequence[Arrival],
        by_user: dict[str, list[int]],
        calls: list[list[str]],
    ) -> Iterator[tuple[Any, ...]]:
        prefix = self._prefix
        limits = self._conn.limits
        specs = self.behaviour_features
        line = event_line if not specs else lambda arrival: event_line_with(arrival, specs)
        for users in calls:
            keys: list[str] = []
            lines: list[str] = []
            for user in users:
                keys += (f"{prefix}:seq:{{{user}}}", f"{prefix}:ids:{{{user}}}")
                indexes = by_user[user]
                if len(indexes) == 1:  # most users of a batch: no comprehension's frame
                    lines.append(line(arrivals[indexes[0]]))
                else:
                    lines.append("".join([line(arrivals[i]) for i in indexes]))
            yield (
                "EVALSHA",
                sha,
                len(keys),
                *keys,
                self.length,
                self._ttl_ms,
                self.dedup_horizon_ms,
                *limits,
                *lines,
            )

    def _item_commands(
        self, sha: str, earliest: dict[str, int], calls: list[list[str]]
    ) -> Iterator[tuple[Any, ...]]:
        prefix = self._prefix
        for items in calls:
            keys = [f"{prefix}:item:{{{item}}}" for item in items]  # item_key(), a call an item less
            times = [earliest[item] for item in items]
            yield ("EVALSHA", sha, len(keys), *keys, self._ttl_ms, *times)

    durable = True  # see PartitionStore.durable

    def claim(self, starts: Mapping[Partition, int], *, create: bool = True) -> dict[Partition, Claim]:
        """See `PartitionStore.claim`."""
        keys = list(starts)

        def commands(shas: tuple[str, ...]) -> Iterator[tuple[Any, ...]]:
            for key in keys:
                part = partition_keys(self._prefix, key)[0]
                yield ("EVALSHA", shas[2], 1, part, starts[key], int(create))

        replies = self._conn.run(commands, list)
        return {key: parse_claim(reply) for key, reply in zip(keys, replies, strict=True)}

    def stateless(self, partitions: Iterable[Partition]) -> set[Partition]:
        """See `PartitionStore.stateless`: one round trip, a PERSIST of each ``part`` hash."""
        keys = list(partitions)
        if not keys:
            return set()

        def commands(shas: tuple[str, ...]) -> Iterator[tuple[Any, ...]]:
            for key in keys:
                part = partition_keys(self._prefix, key)[0]
                yield ("PERSIST", part)
                yield ("EXISTS", part)

        replies = self._conn.run(commands, list)
        return {key for key, there in zip(keys, replies[1::2], strict=True) if not int(there)}

    def lost_reason(self, lost: Mapping[Partition, int]) -> str:
        """Why a consumer refuses this store: it holds no state of ``lost`` (see `lost_reason`)."""
        return lost_reason(f"the feature store at prefix {self._prefix!r}", lost)

    def advance(
        self, batches: Sequence[PartitionBatch], window_ms: int, retention_ms: int
    ) -> list[PartitionOutcome]:
        """See `PartitionStore.advance`."""

        def commands(shas: tuple[str, ...]) -> Iterator[tuple[Any, ...]]:
            for batch in batches:
                keys = partition_keys(self._prefix, batch.partition)
                args = advance_args(batch, window_ms, retention_ms, self._ttl_ms)
                yield ("EVALSHA", shas[3], len(keys), *keys, *args)

        try:
            replies = self._conn.run(commands, list)
        except FeatureStoreError as exc:
            cause = exc.__cause__
            if isinstance(cause, redis.exceptions.ResponseError) and "FENCED" in str(cause):
                raise PartitionFenced(f"{FENCED_ADVICE} ({cause})") from cause
            raise
        return [parse_advance(reply) for reply in replies]

    def check_claims(self, epochs: Mapping[Partition, int]) -> None:
        """See `PartitionStore.check_claims`: one round trip, a partition's epoch each."""
        keys = list(epochs)
        if not keys:
            return

        def commands(shas: tuple[str, ...]) -> Iterator[tuple[Any, ...]]:
            for key in keys:
                yield ("HGET", partition_keys(self._prefix, key)[0], "epoch")

        for key, epoch in zip(keys, self._conn.run(commands, list), strict=True):
            if epoch is None or int(epoch) != epochs[key]:
                raise PartitionFenced(fenced_reason(key, epochs[key], epoch))

    def sequence(self, user_id: str) -> list[Behaviour]:
        """See `FeatureStore.sequence`."""
        try:
            # redis-py types zrange's reply loosely; WITHSCORES gives (member, score) pairs.
            reply = self._redis.zrange(self.key(user_id), -self.length, -1, withscores=True)
            rows = cast(list[tuple[str, float]], reply)
        except redis.RedisError as exc:  # refused, unavailable or failed, as every call here
            raise self._conn.translated(exc) from exc
        return [Behaviour.from_member(m, int(ts)) for m, ts in rows]
