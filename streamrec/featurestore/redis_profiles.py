r"""Redis profile store: one hash per user, a field per user feature holding its points.

Key ``<prefix>:prof:{<user_id>}`` (hash-tagged as the user's sequence keys, so a user's keys
share a Cluster slot): field = the feature's name, value = its points oldest first, each
``ts \x1f <value as JSON>``, joined by ``\x1e`` (JSON never holds a raw control character).

A batch is one pipelined round trip of `PROFILE_LUA` calls, each carrying a few hundred
users (on a Cluster, users of one slot): per user, merge its points (atomic, so a redelivered
batch finds its points there and changes nothing), refresh the TTL when something changed,
and return the hash of each user asked for.

Memory: per user one hash; per declared user feature at most ``points`` points of about
``15 + len(JSON value)`` bytes. Measured (``MEMORY USAGE``, 8-character values, 16 points):
624 bytes a user with one feature, 1,584 with three (``docs/operating/sizing.md``). A user
whose points stop changing expires ``STREAMREC_STORE__TTL_S`` after its last change.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import redis
from redis.cluster import RedisCluster

from streamrec.config import RedisStoreConfig
from streamrec.errors import FeatureStoreError, FeatureStoreUnavailable
from streamrec.features.schema import Value
from streamrec.featurestore.profiles import Profile, ProfilePoint, ProfileStore, decode_value, encode_value
from streamrec.featurestore.redis_options import client_options, store_client
from streamrec.featurestore.redis_server import REFUSED, UNAVAILABLE

# Users per script call, as the sequence store's: a call stays around a millisecond.
_USERS_PER_CALL = 256

# KEYS: one profile hash per user. ARGV: keep (points per feature), ttl_ms, then one string per
# user: ``1`` (return its hash) or ``0``, then one line per point ``feature \x1f ts \x1f json \n``.
# Returns, for each user asked for, its HGETALL (field, points, ...), in KEYS order.
# Points are ordered by time, then by their JSON's bytes (compared byte by byte: Lua's `<` on
# strings follows the server's locale); a point already there, or older than the `keep` kept
# when that many are, changes nothing. Times are compared as Lua numbers (doubles: exact for
# epoch milliseconds) and written back as they came.
PROFILE_LUA = """
local keep, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
local now = redis.call('TIME')
local expires = string.format('%.0f', now[1] * 1000 + math.floor(now[2] / 1000) + ttl)
local function bytes_less(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end
local function less(p, q)  -- p before q: by time, then by value
  if p[1] ~= q[1] then return p[1] < q[1] end
  return bytes_less(p[3], q[3])
end
local out = {}
for u = 1, #KEYS do
  local key, arg = KEYS[u], ARGV[u + 2]
  local lists, dirty = {}, {}
  for feature, ts, value in string.gmatch(string.sub(arg, 2), '([^\\31\\n]*)\\31(%-?%d+)\\31([^\\n]*)\\n') do
    local points = lists[feature]
    if points == nil then
      points = {}
      local stored = redis.call('HGET', key, feature)
      if stored then
        for t, v in string.gmatch(stored, '(%-?%d+)\\31([^\\30]*)') do
          points[#points + 1] = {tonumber(t), t, v}
        end
      end
      lists[feature] = points
    end
    local p = {tonumber(ts), ts, value}
    local at = #points
    while at >= 1 and less(p, points[at]) do at = at - 1 end
    local present = at >= 1 and points[at][1] == p[1] and points[at][3] == value
    if not present and not (#points >= keep and at == 0) then
      table.insert(points, at + 1, p)
      while #points > keep do table.remove(points, 1) end
      dirty[feature] = true
    end
  end
  local changed = false
  for feature, _ in pairs(dirty) do
    local parts = {}
    for i, p in ipairs(lists[feature]) do parts[i] = p[2] .. '\\31' .. p[3] end
    redis.call('HSET', key, feature, table.concat(parts, '\\30'))
    changed = true
  end
  if changed then redis.call('PEXPIREAT', key, expires) end
  if string.sub(arg, 1, 1) == '1' then out[#out + 1] = redis.call('HGETALL', key) end
end
return out
"""


class RedisProfileStore(ProfileStore):
    """User-feature points in Redis (standalone or Cluster-safe keys), with a TTL."""

    def __init__(self, cfg: RedisStoreConfig, points: int = 16, client: redis.Redis | None = None) -> None:
        """Connect to ``cfg.url`` (a Cluster when ``cfg.cluster``), or use ``client``."""
        super().__init__(points)
        self._prefix = cfg.key_prefix
        self._ttl_ms = cfg.ttl_s * 1000
        self._cfg, self._options = cfg, client_options(cfg)
        self._client: redis.Redis | RedisCluster | None = client
        self._owns_client = client is None  # a client given is its caller's to close
        self._sha: str | None = None

    def close(self) -> None:
        """Close the Redis client the store made and its connections (a client given stays open).

        Safe to call more than once; the store connects again if used after it.
        """
        if self._owns_client and self._client is not None:
            client, self._client = self._client, None
            client.close()

    @property
    def _redis(self) -> redis.Redis | RedisCluster:
        """The client, a Cluster's made at first use (`store_client`)."""
        if self._client is None:
            self._client = store_client(self._cfg, self._options, decode_responses=True)
        return self._client

    def key(self, user_id: str) -> str:
        """The hash holding a user's points."""
        return f"{self._prefix}:prof:{{{user_id}}}"

    def update(self, changes: Sequence[ProfilePoint], read: Iterable[str] = ()) -> dict[str, Profile]:
        """See `ProfileStore.update`: one pipelined round trip."""
        lines: dict[str, list[str]] = defaultdict(list)
        for change in changes:
            for name, value in change.values.items():
                lines[change.user_id].append(f"{name}\x1f{change.ts}\x1f{encode_value(value).decode()}\n")
        wanted = list(dict.fromkeys(read))
        users = list(dict.fromkeys([*lines, *wanted]))
        if not users:
            return {}
        asked = set(wanted)
        out: dict[str, Profile] = {}
        for group, reply in self._run(users, lines, asked):
            for user, fields in zip([u for u in group if u in asked], reply, strict=True):
                out[user] = _profile(fields)
        return {user: out[user] for user in wanted}

    def _calls(self, users: list[str]) -> list[list[str]]:
        """Users split into script calls: a few hundred each, of one slot on a Cluster."""
        client = self._redis
        if isinstance(client, RedisCluster):
            by_slot: dict[int, list[str]] = defaultdict(list)
            for user in users:
                by_slot[client.keyslot(self.key(user))].append(user)
            groups = list(by_slot.values())
        else:
            groups = [users]
        return [g[i : i + _USERS_PER_CALL] for g in groups for i in range(0, len(g), _USERS_PER_CALL)]

    def _run(
        self, users: list[str], lines: dict[str, list[str]], asked: set[str]
    ) -> list[tuple[list[str], Any]]:
        """The users' calls (`_calls`) in one pipeline, each with its reply.

        All again with the script reloaded if Redis lost it (idempotent). Redis's failures are
        the store's, the first use's too (a Cluster's client connects as it is made).
        """
        for reload in (False, True):
            try:
                calls = self._calls(users)
                if self._sha is None or reload:
                    self._sha = str(self._redis.script_load(PROFILE_LUA))
                pipe = self._redis.pipeline(transaction=False)
                for group in calls:
                    keys = [self.key(user) for user in group]
                    args = [("1" if user in asked else "0") + "".join(lines.get(user, ())) for user in group]
                    pipe.execute_command("EVALSHA", self._sha, len(keys), *keys, self.points, self._ttl_ms,
                                         *args)
                return list(zip(calls, pipe.execute(), strict=True))
            except redis.exceptions.NoScriptError:
                if reload:
                    raise FeatureStoreUnavailable("redis lost the profile script twice in a row") from None
            except REFUSED as exc:
                raise FeatureStoreError(f"redis refused the profile store: {exc}") from exc
            except UNAVAILABLE as exc:
                raise FeatureStoreUnavailable(f"redis unavailable: {exc}") from exc
            except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
                raise FeatureStoreError(f"redis failed: {exc}") from exc
        raise AssertionError("unreachable: the second pass returns or raises")


def _profile(fields: list[str]) -> Profile:
    """A user's points from its hash (HGETALL's flat field, value list)."""
    out: Profile = {}
    for name, stored in zip(fields[::2], fields[1::2], strict=True):
        points: list[tuple[int, Value]] = []
        for point in stored.split("\x1e"):
            ts, _, raw = point.partition("\x1f")
            points.append((int(ts), decode_value(raw)))
        out[name] = tuple(points)
    return out
