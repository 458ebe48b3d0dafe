"""Redis feature store: one sorted set per user, scored by event time.

Key ``<prefix>:seq:{<user_id>}``: the hash tag puts every key of a user in one Cluster slot.
Member: ``event_id \\t item \\t category \\t action`` (see :class:`Behaviour`), so an event is
stored once however often it is redelivered. Per item, ``<prefix>:item:{<item_id>}`` holds
the first time it was seen.

A batch is one pipelined round trip of small Lua scripts, one per user (ZADD the user's
events, read each asked-for history with an exclusive time bound, trim what no redo of the
batch can need, refresh the TTL) and one per item (SET NX, GET). Each script touches one
key, so it is atomic per user and runs on Redis Cluster (``RedisStoreConfig.cluster``),
where the pipeline is split by slot. One call instead of four or more commands per user
cut the consumer's Redis time by half (``bench/consumer_throughput.py``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any, cast

import redis
from redis.cluster import RedisCluster

from streamrec.config import RedisStoreConfig
from streamrec.errors import FeatureStoreError
from streamrec.events import Event
from streamrec.featurestore.base import Behaviour, FeatureStore, StoreUpdate, earliest_per_item

# ARGV: cap, ttl_ms, n, score_1, member_1 .. score_n, member_n, ts_1 .. ts_q
# Returns one flat [member, score, ...] list per ts: the latest `cap` strictly before it.
# Trims to the latest `cap` entries before the batch's earliest event, keeping everything
# from it on: a batch redone after an aborted commit reads exactly the same histories.
_SEQUENCE_LUA = """
local cap, ttl, n = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local chunk, low = {}, nil
for i = 0, n - 1 do
  local score = ARGV[4 + 2 * i]
  if low == nil or tonumber(score) < tonumber(low) then low = score end
  chunk[#chunk + 1] = score
  chunk[#chunk + 1] = ARGV[5 + 2 * i]
  if #chunk >= 1000 then  -- unpack() has a small stack: add in slices
    redis.call('ZADD', KEYS[1], unpack(chunk))
    chunk = {}
  end
end
if #chunk > 0 then redis.call('ZADD', KEYS[1], unpack(chunk)) end
local out = {}
for i = 4 + 2 * n, #ARGV do
  out[#out + 1] = redis.call('ZREVRANGEBYSCORE', KEYS[1], '(' .. ARGV[i], '-inf',
                             'WITHSCORES', 'LIMIT', 0, cap)
end
if low ~= nil then
  local before = redis.call('ZCOUNT', KEYS[1], '-inf', '(' .. low)
  if before > cap then redis.call('ZREMRANGEBYRANK', KEYS[1], 0, before - cap - 1) end
end
redis.call('PEXPIRE', KEYS[1], ttl)
return out
"""
# ARGV: ts, ttl_ms. Records the first-seen time once; returns the recorded one.
_FIRST_SEEN_LUA = """
redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
return redis.call('GET', KEYS[1])
"""


class RedisFeatureStore(FeatureStore):
    """Length-capped, TTL'd behaviour sequences in Redis (standalone or Cluster-safe keys)."""

    def __init__(self, cfg: RedisStoreConfig, length: int, client: redis.Redis | None = None) -> None:
        """Connect to ``cfg.url`` (a Cluster when ``cfg.cluster``), or use ``client``."""
        super().__init__(length)
        self._prefix = cfg.key_prefix
        self._ttl_ms = cfg.ttl_s * 1000
        self._redis: redis.Redis | RedisCluster = client or (
            RedisCluster.from_url(cfg.url, decode_responses=True, **cfg.client)
            if cfg.cluster
            else redis.Redis.from_url(cfg.url, decode_responses=True, **cfg.client)
        )
        self._shas: tuple[str, str] | None = None  # loaded on first use, again after NOSCRIPT

    def _scripts(self, reload: bool = False) -> tuple[str, str]:
        """SHA1s of the two scripts, loaded on every primary (a cluster loads on all)."""
        if self._shas is None or reload:
            self._shas = (
                self._redis.script_load(_SEQUENCE_LUA),
                self._redis.script_load(_FIRST_SEEN_LUA),
            )
        return self._shas

    def key(self, user_id: str) -> str:
        """The sorted-set key of a user's sequence."""
        return f"{self._prefix}:seq:{{{user_id}}}"

    def item_key(self, item_id: str) -> str:
        """The key holding an item's first-seen time."""
        return f"{self._prefix}:item:{{{item_id}}}"

    def update(self, events: Sequence[Event], before: Sequence[Event]) -> StoreUpdate:
        """See :meth:`FeatureStore.update`."""
        added: dict[str, dict[str, int]] = defaultdict(dict)
        for event in events:
            added[event.user_id][Behaviour.of(event).member()] = event.ts
        asked: dict[str, list[int]] = defaultdict(list)  # user -> indexes into `before`
        for index, event in enumerate(before):
            asked[event.user_id].append(index)
        users = list(added.keys() | asked.keys())
        earliest = earliest_per_item(events)
        try:
            try:
                replies = self._execute(added, asked, before, users, earliest)
            except redis.exceptions.NoScriptError:
                # Redis restarted or failed over: load the scripts again (the batch is
                # idempotent, so running it again is safe).
                self._scripts(reload=True)
                replies = self._execute(added, asked, before, users, earliest)
        except redis.RedisError as exc:
            raise FeatureStoreError(f"redis pipeline failed: {exc}") from exc
        histories: list[list[Behaviour]] = [[] for _ in before]
        for user_id, reads in zip(users, replies, strict=False):
            for index, flat in zip(asked.get(user_id, ()), reads, strict=True):
                pairs = zip(flat[-2::-2], flat[::-2], strict=True)  # oldest first
                histories[index] = [Behaviour.from_member(m, int(ts)) for m, ts in pairs]
        first = replies[len(users) :]
        return StoreUpdate(histories, {item: int(ts) for item, ts in zip(earliest, first, strict=True)})

    def _execute(
        self,
        added: dict[str, dict[str, int]],
        asked: dict[str, list[int]],
        before: Sequence[Event],
        users: list[str],
        earliest: dict[str, int],
    ) -> list[Any]:
        sequence_sha, first_seen_sha = self._scripts()
        pipe = self._redis.pipeline(transaction=False)
        for user_id in users:
            members = added.get(user_id, {})
            args: list[str | int] = [self.length, self._ttl_ms, len(members)]
            for member, ts in members.items():
                args += (ts, member)
            args += (before[i].ts for i in asked.get(user_id, ()))
            pipe.execute_command("EVALSHA", sequence_sha, 1, self.key(user_id), *args)
        for item_id, ts in earliest.items():
            pipe.execute_command(
                "EVALSHA", first_seen_sha, 1, self.item_key(item_id), ts, self._ttl_ms
            )
        return pipe.execute()

    def sequence(self, user_id: str) -> list[Behaviour]:
        """See :meth:`FeatureStore.sequence`."""
        try:
            # redis-py types zrange's reply loosely; WITHSCORES gives (member, score) pairs.
            reply = self._redis.zrange(self.key(user_id), -self.length, -1, withscores=True)
            rows = cast(list[tuple[str, float]], reply)
        except redis.RedisError as exc:
            raise FeatureStoreError(f"redis read failed: {exc}") from exc
        return [Behaviour.from_member(m, int(ts)) for m, ts in rows]

    def ping(self) -> None:
        """Raise :class:`FeatureStoreError` unless Redis answers."""
        try:
            self._redis.ping()
        except redis.RedisError as exc:
            raise FeatureStoreError(f"redis unreachable: {exc}") from exc
