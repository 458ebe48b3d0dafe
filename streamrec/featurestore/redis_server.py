"""What the Redis store asks of a server: version and eviction checks, compact limits, failures told apart."""

from __future__ import annotations

import logging
from typing import Any

import redis
from redis.cluster import RedisCluster

from streamrec.errors import FeatureStoreError

logger = logging.getLogger(__name__)

# Redis's defaults for zset-max-listpack-entries and zset-max-listpack-value: a sorted set of
# at most so many entries, none longer than so many bytes, is kept compact (a listpack).
COMPACT_DEFAULTS = (128, 64)
# A Redis that stops answering must not hang a batch: a batch's round trip takes
# milliseconds, so 5 s means Redis is gone (the caller retries). A connection is given
# STREAMREC_STORE__CONNECT_TIMEOUT_S.
CLIENT_DEFAULTS: dict[str, Any] = {"socket_timeout": 5.0}
# Errors that say the settings are wrong (the user, its password, its ACL): checked first,
# since a refused password is a ConnectionError to redis-py, and no wait will mend it.
REFUSED = (
    redis.exceptions.AuthenticationError,
    redis.exceptions.AuthenticationWrongNumberOfArgsError,
    redis.exceptions.AuthorizationError,
    redis.exceptions.NoPermissionError,
)
# Error replies redis-py has no class for that say a server state which passes: busy with
# another client's script (until it ends or is killed), too few replicas to write to, a
# replica whose primary is down.
PASSING_REPLIES = ("BUSY ", "NOREPLICAS ", "MASTERDOWN ")
# Errors that say Redis is away for now rather than that the request is wrong.
UNAVAILABLE = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.BusyLoadingError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
)
# No answer at all: the connection failed or timed out (LOADING is an answer, though
# redis-py counts it a connection error).
NO_ANSWER = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


#: The scripts set absolute expiry times (``PXAT``, ``PEXPIREAT``): Redis 6.2 or newer.
MIN_REDIS_VERSION = (6, 2)


def check_servers(infos: list[dict[str, Any]]) -> None:
    """Refuse a Redis too old or one that would evict keys.

    Refuse, before any script runs, a Redis older than `MIN_REDIS_VERSION`, and one
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


# The member bytes a sequence entry may need with declared behaviour features: its values
# follow the action (``values``), so an entry of four features (a shop, a brand, three tags,
# a price) on Taobao's ids is up to 59 bytes, against 28 without (``bench/redis_memory.py
# --features 4``); longer ids pass Redis's default 64 and turn the user's sequence into a
# skiplist (a 50-entry sequence of 70-byte members: 9,192 bytes, against 5,176 compact).
# Twice the measured entry leaves room for longer ids, while a full compact sequence (128
# entries) stays a few kilobytes that Redis scans in microseconds.
FEATURED_MEMBER_BYTES = 128


def raise_member_limit(client: redis.Redis | RedisCluster, wanted: int) -> None:
    """Raise Redis's ``zset-max-listpack-value`` to ``wanted`` bytes if it is lower.

    A store that keeps declared behaviour features does so as it starts, so their longer
    entries keep sequences compact. A user that may not run CONFIG (a managed Redis, an ACL
    user held to the store's commands) is told once what to set instead.
    """
    name = "zset-max-listpack-value"
    try:
        reply = client.config_get(name)
        if not reply:  # Redis 6.2 names it ziplist
            name = "zset-max-ziplist-value"
            reply = client.config_get(name)
        if reply and int(str(next(iter(reply.values())))) < wanted:
            client.config_set(name, wanted)
            logger.info("redis %s raised to %s for the declared behaviour features", name, wanted)
    except redis.RedisError as exc:
        logger.warning(
            "redis zset-max-listpack-value not raised to %s (%s): sequence entries with declared "
            "behaviour features longer than its value turn a user's sequence into a skiplist, about "
            "twice the bytes; set it to at least %s on the server",
            wanted, exc, wanted,
        )


def compact_limits(client: redis.Redis | RedisCluster, length: int) -> tuple[int, int]:
    """Redis's compact sorted-set limits: entries, and bytes a member.

    Redis's defaults when the user may not run CONFIG GET. Warns when a full sequence alone
    cannot stay compact (``STREAMREC_MODEL__SEQUENCE_LENGTH`` past the entries limit).
    """
    limits = list(COMPACT_DEFAULTS)
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
            "zset-max-listpack-entries %s: every full sequence is kept as a skiplist, about three "
            "times the bytes; set zset-max-listpack-entries to at least twice the length",
            length,
            limits[0],
        )
    return limits[0], limits[1]


def server_infos(client: redis.Redis | RedisCluster) -> list[dict[str, Any]]:
    """INFO's server and memory sections of each primary (a Cluster's), or of the one server.

    None when the user may not run INFO (an ACL user held to the store's command groups):
    the checks are skipped then, and an old Redis fails with its own error.
    """
    try:
        # a section a call: Redis before 7.0 takes one; a Cluster's primaries one at a
        # time, one reply each
        if isinstance(client, RedisCluster):
            cluster = client
            return [
                {**cluster.info("server", target_nodes=node), **cluster.info("memory", target_nodes=node)}
                for node in cluster.get_primaries()
            ]
        return [{**client.info("server"), **client.info("memory")}]
    except redis.exceptions.NoPermissionError:
        logger.warning("redis version and eviction policy not checked: the user may not run INFO")
        return []
