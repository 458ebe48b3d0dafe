r"""Redis feature store: one sorted set per user, scored by event time.

Keys per user, hash-tagged ``{<user_id>}`` so they share one Cluster slot:

- ``<prefix>:seq:{u}``: the sequence, a sorted set scored by event time; member
  ``event_id \t item \t category \t action`` (see :class:`Behaviour`);
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
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

import hiredis
import redis
from redis.cluster import RedisCluster
from redis.connection import Connection, ConnectionPool
from redis.exceptions import RedisClusterException

from streamrec.config import RedisStoreConfig, redact_url
from streamrec.errors import (
    FeatureStoreError,
    FeatureStoreLost,
    FeatureStoreUnavailable,
    FeatureStoreUnreachable,
    PartitionFenced,
)
from streamrec.featurestore.base import (
    ACCEPTED,
    CONFLICT,
    DUPLICATE,
    Answer,
    Arrival,
    Behaviour,
    FeatureStore,
    History,
    StoreUpdate,
    earliest_per_item,
)
from streamrec.featurestore.partitions import (
    FENCED_ADVICE,
    Claim,
    PartitionBatch,
    PartitionOutcome,
    fenced_reason,
)
from streamrec.featurestore.redis_partitions import (
    ADVANCE_LUA,
    CLAIM_LUA,
    advance_args,
    parse_advance,
    parse_claim,
    partition_keys,
)
from streamrec.kafka.records import Partition

logger = logging.getLogger(__name__)

T = TypeVar("T")

# KEYS: seq, ids of each user of the call, in turn. ARGV: cap, ttl_ms, horizon_ms, Redis's
# compact sorted-set limits (entries, member bytes: see ``_compact_limits``), then one
# string per user holding its events, one line each (see ``_event_line``):
# ``ts \x1f want \x1f member \x1f mark \n``, want 1 when a history is asked for (2 and 3 as
# 0 and 1 for an event judged by its id but not stored, an impression). One string
# per user, not four arguments per event: packing arguments cost redis-py more than Lua's
# one pattern match per line costs Redis.
# Returns one flat list, one string per event in call order: ``0`` and, when asked for, its
# history (accepted; the latest `cap` entries strictly before its time, newest first, members
# and scores joined by tabs), ``3`` (accepted, and its history is that of the user's event
# read before it, at the same time), or ``1`` (duplicate) / ``2`` (conflict) and what the id
# holds.
# Per user, trims the sequence to the latest `cap` entries before the batch's earliest
# accepted event, keeping everything from it on, so a batch redone after an aborted commit
# reads exactly the same histories. A batch can so push the sequence past Redis's compact
# limit (128 entries) before the trim: Redis makes it a skiplist (about five times the bytes)
# and never turns it back, so once the trim brings it within the limit again the sequence is
# written afresh, compact. Only a call that may have passed the limit (the entries before the
# batch and the batch's own exceed it) checks: none of a user's usual calls.
# An id is remembered as ``mark \t ts``. It counts as forgotten once it is older than the
# horizon behind the user's newest event before the call (the newest entry of the sequence,
# which trimming never removes), as if it had been deleted then; it is deleted for real when
# the newest event crosses a multiple of the horizon, so an id stays in Redis at most two
# horizons. Commands are what Redis spends its time on (about a microsecond each), so they
# are saved where the answer is known: HSETNX judges a new id in one command, no sorted set
# of ids to keep in step, and the count before the earliest event is that event's history
# when it is short. Constant arguments go to redis.call as strings: a Lua number is printed
# first (a printf each: 6% of Redis's instructions in the benchmark). Expiry times are
# absolute (PEXPIREAT here, SET ... PXAT for items, from the script's TIME): Redis rewrites a
# relative PEXPIRE or PX into the absolute form for propagation, and the rewrite was 3% of
# its instructions in the benchmark (``bench/redis_instructions.py``).
_SEQUENCE_LUA = """
local cap, ttl, horizon = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local entries, value = tonumber(ARGV[4]), tonumber(ARGV[5])
local quarter = math.max(1, math.floor(tonumber(ttl) / 4))
local now = redis.call('TIME')
local expires = string.format('%.0f', now[1] * 1000 + math.floor(now[2] / 1000) + tonumber(ttl))
-- a sequence Redis turned into a skiplist (it passed `entries`) written afresh, compact, once
-- it fits again: Redis never turns one back by itself
local function compact(seq, ids)
  if redis.call('ZCARD', seq) > entries or redis.call('OBJECT', 'ENCODING', seq) ~= 'skiplist' then
    return
  end
  local all, args = redis.call('ZRANGE', seq, '0', '-1', 'WITHSCORES'), {}
  for i = 1, #all, 2 do
    if #all[i] > value then return end  -- too long a member for the compact form
    args[i], args[i + 1] = all[i + 1], all[i]
  end
  redis.call('DEL', seq)
  redis.call('ZADD', seq, unpack(args))
  redis.call('PEXPIREAT', seq, expires)
  redis.call('PEXPIREAT', ids, expires)
end
local out = {}
for u = 1, #ARGV - 5 do
  local seq, ids = KEYS[2 * u - 1], KEYS[2 * u]
  local top = redis.call('ZREVRANGE', seq, '0', '0', 'WITHSCORES')
  local newest = tonumber(top[2])  -- nil for a user without a sequence
  local chunk, added, reads, low, lowscore, high = {}, {}, {}, nil, nil, newest
  for score, want, member, id, mark in
      string.gmatch(ARGV[u + 5], '(%-?%d+)\\31(%d)\\31(([^\\t]*)[^\\31]*)\\31([^\\n]*)\\n') do
    local code, seen, value = 0, nil, mark .. '\\t' .. score
    if redis.call('HSETNX', ids, id, value) == 0 then
      seen = redis.call('HGET', ids, id)
      -- a bare mark was written before ids kept their time: the same record too
      if seen ~= value and seen ~= mark then
        local at = tonumber(string.match(seen, '\\t(%-?%d+)$'))
        if at ~= nil and newest ~= nil and at < newest - horizon and not added[id] then
          redis.call('HSET', ids, id, value)  -- forgotten: a new id again
        elseif string.match(seen, '^[^\\t]*') == string.match(mark, '^[^\\t]*') then
          code = 1
        else
          code = 2
        end
      end
    end
    if code == 0 then
      added[id] = true
      local n = tonumber(score)
      if low == nil or n < low then low, lowscore = n, score end
      if high == nil or n > high then high = n end
      if want < '2' then  -- 2 and 3: judged, not stored
        chunk[#chunk + 1] = score
        chunk[#chunk + 1] = member
      end
      if want == '1' or want == '3' then  -- its history is read once the batch is in
        reads[#reads + 1] = #out + 1
        out[#out + 1] = score
      else
        out[#out + 1] = '0'
      end
    else
      out[#out + 1] = code .. seen
    end
  end
  for i = 1, #chunk, 1000 do  -- unpack() has a small stack: add in slices
    redis.call('ZADD', seq, unpack(chunk, i, math.min(i + 999, #chunk)))
  end
  -- entries stored strictly before low, once known: none for a new user (only this call's
  -- events are stored), or as a history read at low tells
  local before = nil
  if newest == nil then before = 0 end
  local last = nil  -- the time of the read before: events at one time share their history
  for _, at in ipairs(reads) do
    local score = out[at]
    if before == 0 and tonumber(score) <= low then
      out[at] = '0'  -- nothing is stored before it: no read
    elseif score == last then
      out[at] = '3'  -- the history of the read before (a page of impressions, say)
    else
      local history = redis.call('ZREVRANGEBYSCORE', seq, '(' .. score, '-inf', 'WITHSCORES', 'LIMIT', '0',
        ARGV[1])
      if score == lowscore and #history < 2 * cap then before = #history / 2 end
      out[at] = '0' .. table.concat(history, '\\t')
    end
    last = score
  end
  if low ~= nil then
    if before == nil then before = redis.call('ZCOUNT', seq, '-inf', '(' .. lowscore) end
    if before > cap then redis.call('ZREMRANGEBYRANK', seq, 0, before - cap - 1) end
    if before + #chunk / 2 > entries then compact(seq, ids) end  -- it may have passed them
    if newest ~= nil and horizon > 0 and math.floor(high / horizon) > math.floor(newest / horizon) then
      local all, old = redis.call('HGETALL', ids), {}
      for i = 1, #all, 2 do
        local at = tonumber(string.match(all[i + 1], '\\t(%-?%d+)$'))
        if at ~= nil and at < high - horizon then old[#old + 1] = all[i] end
      end
      for i = 1, #old, 1000 do
        redis.call('HDEL', ids, unpack(old, i, math.min(i + 999, #old)))
      end
    end
  end
  -- a new user's keys get the TTL, refreshed when the user's newest event time enters a new
  -- quarter of it: two commands a user per quarter TTL, not per batch
  if newest == nil or (high ~= nil and math.floor(high / quarter) > math.floor(newest / quarter)) then
    redis.call('PEXPIREAT', seq, expires)
    redis.call('PEXPIREAT', ids, expires)
  end
end
return out
"""
# KEYS: item keys. ARGV: ttl_ms, then one time per key. Keeps the earliest time each item was
# seen, so it does not depend on the order events arrive in (a late event, a rebuild);
# returns the recorded times. A new item, most of them, costs one command.
_FIRST_SEEN_LUA = """
local out = {}
local now = redis.call('TIME')
local expires = string.format('%.0f', now[1] * 1000 + math.floor(now[2] / 1000) + tonumber(ARGV[1]))
for i = 1, #KEYS do
  local ts = ARGV[i + 1]
  local seen = ts
  if not redis.call('SET', KEYS[i], ts, 'NX', 'PXAT', expires) then
    seen = redis.call('GET', KEYS[i])
    if tonumber(ts) < tonumber(seen) then
      redis.call('SET', KEYS[i], ts, 'PXAT', expires)
      seen = ts
    end
  end
  out[i] = seen
end
return out
"""
# Redis's defaults for zset-max-listpack-entries and zset-max-listpack-value: a sorted set of
# at most so many entries, none longer than so many bytes, is kept compact (a listpack).
_COMPACT_DEFAULTS = (128, 64)
# Users (and items) per script call: one call per user cost most of the consumer's time in
# redis-py packing and parsing; a few hundred per call keep each call to a millisecond or
# so, short enough not to hold up other clients of Redis.
_USERS_PER_CALL = 256
_ITEMS_PER_CALL = 1_000
# A Redis that stops answering must not hang a batch: a batch's round trip takes
# milliseconds, so 5 s means Redis is gone (the caller retries). A connection is given
# STREAMREC_STORE__CONNECT_TIMEOUT_S.
_CLIENT_DEFAULTS: dict[str, Any] = {"socket_timeout": 5.0}
# Errors that say the settings are wrong (the user, its password, its ACL): checked first,
# since a refused password is a ConnectionError to redis-py, and no wait will mend it.
_REFUSED = (
    redis.exceptions.AuthenticationError,
    redis.exceptions.AuthenticationWrongNumberOfArgsError,
    redis.exceptions.AuthorizationError,
    redis.exceptions.NoPermissionError,
)
# Error replies redis-py has no class for that say a server state which passes: busy with
# another client's script (until it ends or is killed), too few replicas to write to, a
# replica whose primary is down.
_PASSING_REPLIES = ("BUSY ", "NOREPLICAS ", "MASTERDOWN ")
# Errors that say Redis is away for now rather than that the request is wrong.
_UNAVAILABLE = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.BusyLoadingError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
)
# How a rebuild's marker ends: the consumers tell a rebuild from a store started afresh.
_REBUILT = " rebuilt"
# No answer at all: the connection failed or timed out (LOADING is an answer, though
# redis-py counts it a connection error).
_NO_ANSWER = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


class RedisFeatureStore(FeatureStore):
    """Length-capped, TTL'd behaviour sequences in Redis (standalone or Cluster-safe keys)."""

    def __init__(
        self,
        cfg: RedisStoreConfig,
        length: int,
        dedup_horizon_ms: int = 6 * 3_600_000,
        client: redis.Redis | None = None,
    ) -> None:
        """Connect to ``cfg.url`` (a Cluster when ``cfg.cluster``), or use ``client``.

        A Cluster client connects as it is made (to read the slots), so it is made when the
        store is first used: a consumer started before its Cluster is up then waits for it
        in :meth:`attach`, as for a standalone Redis.
        """
        super().__init__(length, dedup_horizon_ms)
        self._prefix = cfg.key_prefix
        self._ttl_ms = cfg.ttl_s * 1000
        self._url = cfg.url
        self._options = {**_CLIENT_DEFAULTS, "socket_connect_timeout": cfg.connect_timeout_s, **cfg.client}
        self._answered = False  # whether Redis answered anything since this store was made
        self._user = str(self._options.get("username") or urlsplit(cfg.url).username or "default")
        self._client: redis.Redis | RedisCluster | None = client or (
            None if cfg.cluster else redis.Redis.from_url(cfg.url, decode_responses=True, **self._options)
        )
        self._shas: tuple[str, ...] | None = None  # loaded on first use, again after NOSCRIPT
        self._limits = _COMPACT_DEFAULTS  # Redis's compact sorted-set limits, read with the scripts
        self._markers: dict[str, str] | None = None  # marker key -> value, set by attach()

    @property
    def _redis(self) -> redis.Redis | RedisCluster:
        """The client; a Cluster's made on first use (see :meth:`__init__`).

        Raises:
            FeatureStoreUnavailable: no node of the Cluster answered.
            FeatureStoreError: the nodes answered, but not as a Cluster.
        """
        if self._client is None:
            try:
                self._client = RedisCluster.from_url(self._url, decode_responses=True, **self._options)
            except (RedisClusterException, redis.RedisError) as exc:
                # redis-py raises "cannot be connected" both when no node answers and when
                # one answers without Cluster mode: the cause tells them apart
                cause = exc.__cause__ or exc
                if isinstance(cause, _REFUSED + _UNAVAILABLE):
                    raise self._translated(cause) from exc
                if isinstance(cause, OSError):
                    raise self._unavailable(exc) from exc
                raise FeatureStoreError(f"redis failed: {exc}") from exc
        return self._client

    def _scripts(self, reload: bool = False) -> tuple[str, ...]:
        """The SHA1s of the store's scripts, loaded on every primary.

        SHA1s of the scripts (sequences, first seen, claim, advance), loaded on every
        primary (a cluster loads on all).
        """
        if self._shas is None or reload:
            self._limits = _compact_limits(self._redis, self.length)
            self._shas = tuple(
                self._redis.script_load(script)
                for script in (_SEQUENCE_LUA, _FIRST_SEEN_LUA, CLAIM_LUA, ADVANCE_LUA)
            )
        return self._shas

    def key(self, user_id: str) -> str:
        """The sorted-set key of a user's sequence."""
        return f"{self._prefix}:seq:{{{user_id}}}"

    def item_key(self, item_id: str) -> str:
        """The key holding an item's first-seen time."""
        return f"{self._prefix}:item:{{{item_id}}}"

    def attach(self, can_start_empty: bool) -> None:
        """See :meth:`FeatureStore.attach`.

        The marker is one key per primary (on a Cluster, keys whose slots each primary
        serves), so a node that restarts empty is noticed too.
        """
        keys = self._marker_keys()  # makes a Cluster's client, or says why it cannot
        try:
            _check_servers(self._server_infos())
            self._answered = True
            values = [self._redis.get(key) for key in keys]
            if not any(values) and can_start_empty:
                value = f"{uuid.uuid4().hex} {datetime.now(UTC).isoformat(timespec='seconds')}"
                for key in keys:
                    self._redis.set(key, value, nx=True)
                values = [self._redis.get(key) for key in keys]
        except redis.RedisError as exc:
            raise self._translated(exc) from exc
        if not all(values):
            raise FeatureStoreLost(
                f"the feature store at prefix {self._prefix!r} has lost its data (no marker; "
                "Redis restarted without persistence?), while events were processed before: "
                "stop the consumers and run `streamrec consumers rebuild`"
            )
        self._markers = {key: str(value) for key, value in zip(keys, values, strict=True)}
        marker = next(iter(self._markers.values()))
        logger.info("feature store attached prefix=%s marker=%r", self._prefix, marker)

    def _translated(self, exc: redis.RedisError) -> FeatureStoreError:
        """A Redis failure as the store's.

        Refused (the settings), unavailable for now, or failed.
        """
        if isinstance(exc, _REFUSED):
            return FeatureStoreError(
                f"redis refused user {self._user!r}: {exc} (check the user and password in "
                "STREAMREC_STORE__URL; the store needs @read, @write, @scripting and @fast on "
                f"the keys matching '{self._prefix}:*')"
            )
        if isinstance(exc, _NO_ANSWER) and not isinstance(exc, redis.exceptions.BusyLoadingError):
            return self._unavailable(exc)
        self._answered = True  # anything else is a reply
        if isinstance(exc, _UNAVAILABLE) or str(exc).startswith(_PASSING_REPLIES):
            return FeatureStoreUnavailable(f"redis unavailable: {exc}")
        if isinstance(exc, redis.exceptions.OutOfMemoryError):
            return FeatureStoreError(
                f"redis is out of memory: {exc} (raise its maxmemory, or shorten how long "
                "sequences are kept, STREAMREC_STORE__TTL_S; the batch was not committed and "
                "is redone on restart)"
            )
        return FeatureStoreError(f"redis failed: {exc}")

    def _unavailable(self, exc: Exception) -> FeatureStoreUnavailable:
        """No answer: an outage once Redis has answered, else a Redis never reached."""
        if self._answered:
            return FeatureStoreUnavailable(f"redis unavailable: {exc}")
        return FeatureStoreUnreachable(
            f"redis at {redact_url(self._url)} did not answer (STREAMREC_STORE__URL, --redis-url): {exc}"
        )

    def _server_infos(self) -> list[dict[str, Any]]:
        """INFO's server and memory sections of each primary (a Cluster's), or of the one server.

        None when the user may not run INFO (an ACL user held to the store's command groups):
        the checks are skipped then, and an old Redis fails with its own error.
        """
        try:
            # a section a call: Redis before 7.0 takes one; a Cluster's primaries one at a
            # time, one reply each
            if isinstance(self._redis, RedisCluster):
                cluster = self._redis
                return [
                    {**cluster.info("server", target_nodes=node), **cluster.info("memory", target_nodes=node)}
                    for node in cluster.get_primaries()
                ]
            return [{**self._redis.info("server"), **self._redis.info("memory")}]
        except redis.exceptions.NoPermissionError:
            logger.warning("redis version and eviction policy not checked: the user may not run INFO")
            return []

    def reset_marker(self) -> None:
        """See :meth:`FeatureStore.reset_marker`."""
        value = f"{uuid.uuid4().hex} {datetime.now(UTC).isoformat(timespec='seconds')}{_REBUILT}"
        try:
            for key in self._marker_keys():
                self._redis.set(key, value)
        except redis.RedisError as exc:
            raise FeatureStoreError(f"cannot write the store marker: {exc}") from exc
        self._markers = None

    def _marker_keys(self) -> list[str]:
        """``<prefix>:marker:{<tag>}``: one key, or one per Cluster primary."""
        if not isinstance(self._redis, RedisCluster):
            return [f"{self._prefix}:marker:{{0}}"]
        wanted = {node.name for node in self._redis.get_primaries()}
        keys: dict[str, str] = {}
        for tag in range(100_000):  # a few dozen tags cover a handful of primaries
            key = f"{self._prefix}:marker:{{{tag}}}"
            node = self._redis.get_node_from_key(key)
            if node is not None and node.name in wanted and node.name not in keys:
                keys[node.name] = key
            if len(keys) == len(wanted):
                break
        return sorted(keys.values())

    def update(self, arrivals: Sequence[Arrival], meanwhile: Callable[[], None] | None = None) -> StoreUpdate:
        """See :meth:`FeatureStore.update`.

        One round trip: the markers, the items' first-seen calls, then the users' calls.
        ``first_seen`` is read before the update is returned; the answers are parsed as the
        caller asks for them, each user call's reply as it arrives, while Redis runs the
        later calls.

        Raises:
            FeatureStoreLost: the markers :meth:`attach` found are gone: Redis lost its data.
        """
        by_user: dict[str, list[int]] = defaultdict(list)  # user -> indexes into arrivals
        for index, arrival in enumerate(arrivals):
            by_user[arrival.event.user_id].append(index)
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
            self._check_markers([next(replies) for _ in markers])
            seen: dict[str, int] = {}
            for items in item_calls:
                seen.update(zip(items, map(int, next(replies)), strict=True))
            return seen

        seen, replies = self._open(commands, first_seen, meanwhile)
        answers = self._answers(replies, arrivals, by_user, calls)
        return StoreUpdate(seen, answers, replies.close)

    def _answers(
        self,
        replies: _Replies,
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
        answers: list[Answer] = [_FRESH] * len(arrivals)
        parsed = 0
        try:
            for index, arrival in enumerate(arrivals):
                need = call_of[arrival.event.user_id]
                while parsed <= need:
                    users, reply = calls[parsed], self._next_reply(replies)
                    expected = sum(len(by_user[user]) for user in users)
                    if len(reply) != expected:
                        raise FeatureStoreError(f"redis answered {len(reply)} verdicts for {expected} events")
                    _parse_call(iter(reply), users, by_user, arrivals, answers)
                    parsed += 1
                yield answers[index]
        except BaseException:  # a failure, or the answers given up: no replies left on the connection
            replies.close()
            raise
        replies.close()  # given back, if the last reply did not already (a batch with no users)

    def _next_reply(self, replies: Iterator[Any]) -> Any:
        """The next reply of a round trip already under way, its failures as the store's."""
        try:
            return next(replies)
        except redis.exceptions.NoScriptError as exc:  # lost after the first calls ran
            self._shas = None  # loaded again when the batch is redone
            raise FeatureStoreUnavailable(f"redis lost the scripts mid-batch: {exc}") from exc
        except redis.RedisError as exc:
            raise self._translated(exc) from exc

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

    def _check_markers(self, values: list[Any]) -> None:
        """Raise unless every marker still holds what :meth:`attach` found."""
        if self._markers is None or values == list(self._markers.values()):
            return
        where = f"the feature store at prefix {self._prefix!r}"
        if all(values) and all(str(v).endswith(_REBUILT) for v in values):
            raise FeatureStoreLost(
                f"{where} was rebuilt while the consumers ran (`streamrec consumers rebuild`; its "
                "marker changed): restart the consumers, nothing else to do; the unfinished batch "
                "is redone"
            )
        if all(values):  # a new marker, not a rebuild's: a store started afresh since
            raise FeatureStoreLost(
                f"{where} lost its data while consumers ran and was started afresh by another "
                "process (its marker changed): stop the consumers and run `streamrec consumers "
                "rebuild --force`"
            )
        raise FeatureStoreLost(
            f"{where} lost its data while consumers ran (its marker is gone: Redis restarted "
            "without persistence, or was flushed): stop the consumers and run `streamrec "
            "consumers rebuild`"
        )

    def _user_commands(
        self,
        sha: str,
        arrivals: Sequence[Arrival],
        by_user: dict[str, list[int]],
        calls: list[list[str]],
    ) -> Iterator[tuple[Any, ...]]:
        prefix = self._prefix
        limits = self._limits
        for users in calls:
            keys: list[str] = []
            lines: list[str] = []
            for user in users:
                keys += (f"{prefix}:seq:{{{user}}}", f"{prefix}:ids:{{{user}}}")
                indexes = by_user[user]
                if len(indexes) == 1:  # most users of a batch: no comprehension's frame
                    lines.append(_event_line(arrivals[indexes[0]]))
                else:
                    lines.append("".join([_event_line(arrivals[i]) for i in indexes]))
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

    def claim(self, starts: Mapping[Partition, int]) -> dict[Partition, Claim]:
        """See :meth:`PartitionStore.claim`."""
        keys = list(starts)

        def commands(shas: tuple[str, ...]) -> Iterator[tuple[Any, ...]]:
            for key in keys:
                part = partition_keys(self._prefix, key)[0]
                yield ("EVALSHA", shas[2], 1, part, starts[key], self._ttl_ms)

        return {key: parse_claim(reply) for key, reply in zip(keys, self._run(commands, list), strict=True)}

    def advance(
        self, batches: Sequence[PartitionBatch], window_ms: int, retention_ms: int
    ) -> list[PartitionOutcome]:
        """See :meth:`PartitionStore.advance`."""

        def commands(shas: tuple[str, ...]) -> Iterator[tuple[Any, ...]]:
            for batch in batches:
                keys = partition_keys(self._prefix, batch.partition)
                args = advance_args(batch, window_ms, retention_ms, self._ttl_ms)
                yield ("EVALSHA", shas[3], len(keys), *keys, *args)

        try:
            replies = self._run(commands, list)
        except FeatureStoreError as exc:
            cause = exc.__cause__
            if isinstance(cause, redis.exceptions.ResponseError) and "FENCED" in str(cause):
                raise PartitionFenced(f"{FENCED_ADVICE} ({cause})") from cause
            raise
        return [parse_advance(reply) for reply in replies]

    def check_claims(self, epochs: Mapping[Partition, int]) -> None:
        """See :meth:`PartitionStore.check_claims`: one round trip, a partition's epoch each."""
        keys = list(epochs)
        if not keys:
            return

        def commands(shas: tuple[str, ...]) -> Iterator[tuple[Any, ...]]:
            for key in keys:
                yield ("HGET", partition_keys(self._prefix, key)[0], "epoch")

        for key, epoch in zip(keys, self._run(commands, list), strict=True):
            if epoch is None or int(epoch) != epochs[key]:
                raise PartitionFenced(fenced_reason(key, epochs[key], epoch))

    def _run(
        self,
        commands: Callable[[tuple[str, ...]], Iterable[tuple[Any, ...]]],
        read: Callable[[Iterator[Any]], T],
    ) -> T:
        """One pipelined round trip, every reply handed to ``read``.

        One pipelined round trip of ``commands(script shas)``, every reply handed to
        ``read`` (see :meth:`_open`).
        """
        result, replies = self._open(commands, read)
        replies.close()
        return result

    def _open(
        self,
        commands: Callable[[tuple[str, ...]], Iterable[tuple[Any, ...]]],
        head: Callable[[Iterator[Any]], T],
        meanwhile: Callable[[], None] | None = None,
    ) -> tuple[T, _Replies]:
        """Send ``commands(script shas)`` in one pipelined round trip and hand the first replies to ``head``.

        All over again with the scripts reloaded if Redis lost them (a restart or failover;
        every call here can safely run again). Returns what ``head`` made and the replies after
        its, to be read or closed. ``meanwhile`` runs once, after the commands went out.

        On a standalone Redis each command goes out as soon as it is made and each reply is
        read when asked for, while Redis still runs the later ones: packing and parsing
        overlap Redis's work.
        """
        once = [meanwhile] if meanwhile is not None else []
        for reload in (False, True):
            replies: _Replies | None = None
            try:
                replies = self._send(commands(self._scripts(reload)), once)
                return head(replies), replies
            except BaseException as exc:
                if replies is not None:
                    replies.close()
                if isinstance(exc, redis.exceptions.NoScriptError) and not reload:
                    continue
                if isinstance(exc, redis.RedisError):
                    raise self._translated(exc) from exc
                raise
        raise AssertionError("unreachable: the second pass returns or raises")

    def _send(self, commands: Iterable[tuple[Any, ...]], meanwhile: list[Callable[[], None]]) -> _Replies:
        if isinstance(self._redis, RedisCluster):  # the cluster client routes a pipeline by slot
            pipe = self._redis.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command)
            while meanwhile:  # it sends only in execute(): nothing to overlap with
                meanwhile.pop()()
            return _Replies(ready=pipe.execute())
        pool = self._redis.connection_pool
        replies = _Replies(pool)
        try:
            for command in commands:
                replies.send(command)
            while meanwhile:  # Redis is busy with the commands now
                meanwhile.pop()()
        except BaseException:
            replies.close()
            raise
        if not replies.left:  # nothing sent: no reply will give the connection back
            replies.close()
        return replies

    def sequence(self, user_id: str) -> list[Behaviour]:
        """See :meth:`FeatureStore.sequence`."""
        try:
            # redis-py types zrange's reply loosely; WITHSCORES gives (member, score) pairs.
            reply = self._redis.zrange(self.key(user_id), -self.length, -1, withscores=True)
            rows = cast(list[tuple[str, float]], reply)
        except redis.RedisError as exc:  # refused, unavailable or failed, as every call here
            raise self._translated(exc) from exc
        return [Behaviour.from_member(m, int(ts)) for m, ts in rows]


class _Replies:
    """The replies of one pipelined round trip, read one at a time, and the connection they come on.

    Given back to the pool once every reply is read, dropped when closed with replies unread
    (they would be out of step for the connection's next user).
    """

    def __init__(self, pool: ConnectionPool | None = None, ready: list[Any] | None = None) -> None:
        """Replies to come on a connection from ``pool``, or ready ones.

        Replies to come on a connection taken from ``pool``, or ``ready`` (a Cluster
        pipeline's, read at once).
        """
        self._pool = pool
        self._conn: Connection | None = None if pool is None else pool.get_connection()
        self._ready = iter(ready or [])
        self.left = len(ready or [])

    def send(self, command: tuple[Any, ...]) -> None:
        """Send one more command on the connection."""
        if self._conn is None:
            raise ValueError("no connection to send on")
        # hiredis packs in C; redis-py first walks every argument in Python (~2% of a
        # consumer's time, at hundreds of arguments a call)
        self._conn.send_packed_command([hiredis.pack_command(command)])
        self.left += 1

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if not self.left:
            raise StopIteration
        if self._pool is None:
            self.left -= 1
            return next(self._ready)
        if self._conn is None:
            raise FeatureStoreUnavailable("the redis connection of this round trip was given up")
        try:
            reply = self._conn.read_response()
        except BaseException:
            self.close()
            raise
        self.left -= 1
        if not self.left:
            self.close()
        return reply

    def close(self) -> None:
        """Give the connection back, dropped if replies are left unread."""
        conn, self._conn = self._conn, None
        if conn is not None and self._pool is not None:
            if self.left:
                conn.disconnect()
            self._pool.release(conn)


#: The scripts set absolute expiry times (``PXAT``, ``PEXPIREAT``): Redis 6.2 or newer.
MIN_REDIS_VERSION = (6, 2)


def _check_servers(infos: list[dict[str, Any]]) -> None:
    """Refuse a Redis too old or one that would evict keys.

    Refuse, before any script runs, a Redis older than :data:`MIN_REDIS_VERSION`, and one
    that would evict keys: with a memory limit and any policy but ``noeviction``, Redis drops
    keys under pressure without a word (every key of the store has a TTL, so the volatile
    policies take them too): sequences cut short, ids forgotten, the join's windows gone.
    """
    for info in infos:
        version = str(info["redis_version"])
        parts = tuple(int(part) for part in version.split(".")[:2] if part.isdigit())
        if parts < MIN_REDIS_VERSION:
            need = ".".join(map(str, MIN_REDIS_VERSION))
            raise FeatureStoreError(
                f"redis {version} is too old for the feature store: it needs {need} or newer"
            )
        policy = info.get("maxmemory_policy", "noeviction")
        if int(info.get("maxmemory", 0)) > 0 and policy != "noeviction":
            raise FeatureStoreError(
                f"redis runs with maxmemory {info['maxmemory']} and maxmemory-policy {policy}: "
                "under memory pressure it would drop the feature store's keys without a word "
                "(histories cut short, ids forgotten, join windows lost); set maxmemory-policy "
                "noeviction (Redis's default), or no maxmemory"
            )


def _compact_limits(client: redis.Redis | RedisCluster, length: int) -> tuple[int, int]:
    """Redis's compact sorted-set limits: entries, and bytes a member.

    Redis's defaults when the user may not run CONFIG GET. Warns when a full sequence alone
    cannot stay compact (``STREAMREC_MODEL__SEQUENCE_LENGTH`` past the entries limit).
    """
    limits = list(_COMPACT_DEFAULTS)
    try:
        for k, name in enumerate(("zset-max-listpack-entries", "zset-max-listpack-value")):
            reply = client.config_get(name) or client.config_get(name.replace("listpack", "ziplist"))
            if reply:  # Redis 7 names the setting listpack, 6.2 ziplist
                limits[k] = int(str(next(iter(reply.values()))))
    except redis.RedisError as exc:  # an ACL user held to the store's commands, a managed Redis
        logger.debug("redis compact limits not read, defaults assumed: %s", exc)
    if length > limits[0]:
        logger.warning(
            "sequences of %s behaviours (STREAMREC_MODEL__SEQUENCE_LENGTH) pass redis's "
            "zset-max-listpack-entries %s: every full sequence is kept as a skiplist, about five "
            "times the bytes; set zset-max-listpack-entries to at least twice the length",
            length,
            limits[0],
        )
    return limits[0], limits[1]


def _parse_call(
    reply: Iterator[str],
    users: list[str],
    by_user: dict[str, list[int]],
    arrivals: Sequence[Arrival],
    answers: list[Answer],
) -> None:
    """Fill ``answers`` from one user call's reply (see ``_SEQUENCE_LUA``)."""
    for user in users:
        last = _EMPTY  # the user's history read before, which ``3`` repeats
        for index in by_user[user]:
            answer = next(reply)
            code = answer[0]
            if code == "0":
                if arrivals[index].wants_history:
                    last = _history(answer)
                    answers[index] = (ACCEPTED, last, "")
            elif code == "3":
                answers[index] = (ACCEPTED, last, "")
            else:  # what the id holds: fingerprint, origin, time
                answers[index] = (_VERDICTS[code], None, answer.split("\t", 2)[1])


_VERDICTS = {"0": ACCEPTED, "1": DUPLICATE, "2": CONFLICT}


_WANT = {(True, False): "0", (True, True): "1", (False, False): "2", (False, True): "3"}


def _event_line(arrival: Arrival) -> str:
    r"""One event as the sequence script reads it: ``ts \x1f want \x1f member \x1f mark \n``.

    Ids are printable (the event contract), so neither the unit separator nor a newline can
    occur inside one.
    """
    e = arrival.event
    want = _WANT[arrival.stored, arrival.wants_history]
    return (
        f"{e.ts}\x1f{want}\x1f{e.event_id}\t{e.item_id}\t{e.category_id}\t{e.action}"
        f"\x1f{e.fingerprint()}\t{arrival.origin}\n"
    )


def _history(answer: str) -> History:
    r"""The history in an accepted event's answer.

    ``0``, then ``member \t score`` newest first, all joined by tabs: each entry reads ``id item
    category action score``, the first id after the ``0``.

    The split makes a string of every field: a few microseconds for a full history, a quarter
    of the consumer's time on the 814-user Taobao file (histories ~32 long). So the answer is
    not copied first, nor every field reversed: only the items and categories a sample carries.
    """
    if len(answer) == 1:
        return _EMPTY
    fields = answer.split("\t")
    items, categories = fields[1::5], fields[2::5]
    items.reverse()
    categories.reverse()

    def make() -> list[Behaviour]:
        ids = fields[0::5]
        ids[0] = ids[0][1:]  # the answer's code before the first id
        return [
            Behaviour(int(fields[k + 4]), ids[k // 5], fields[k + 1], fields[k + 2], fields[k + 3])
            for k in range(len(fields) - 5, -1, -5)
        ]

    return History(tuple(items), tuple(categories), make)


_EMPTY = History((), (), list)
_FRESH: Answer = (ACCEPTED, None, "")  # accepted, no history asked for
