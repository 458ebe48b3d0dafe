"""The store's Redis clients: made (`store_client`), with their options checked (`client_options`).

The options: the defaults, the connect timeout and ``STREAMREC_STORE__CLIENT``.

redis-py makes its connections when first used, so an option it does not take would fail there,
deep in the first command (a ``TypeError`` traceback at a consumer's attach, or at each
``/score``): it is checked here, as the store is made, instead.
"""

from __future__ import annotations

import inspect
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from streamrec.config import RedisStoreConfig, redact_url
from streamrec.config.section import MAX_SECONDS
from streamrec.errors import ConfigError
from streamrec.featurestore.redis_server import CLIENT_DEFAULTS, NO_ANSWER, REFUSED


def client_options(cfg: RedisStoreConfig) -> dict[str, Any]:
    """The options a store's client is made with, each one checked.

    Raises:
        ConfigError: an option of ``STREAMREC_STORE__CLIENT`` that no connection to ``cfg.url``
            takes, named.
    """
    options = {**CLIENT_DEFAULTS, "socket_connect_timeout": cfg.connect_timeout_s, **cfg.client}
    for name in _TIMEOUTS:  # redis-py keeps any value, and a socket refuses it at the first connection
        if name in cfg.client and not _a_timeout(cfg.client[name]):
            raise ConfigError(
                f"STREAMREC_STORE__CLIENT {name} {cfg.client[name]!r} is no socket timeout: a number of "
                f"seconds above 0 and at most {MAX_SECONDS:,} (a century), or null for none"
            )
    # a Cluster client takes its own options and hands the rest to its nodes' connections
    own = set(inspect.signature(RedisCluster.__init__).parameters) if cfg.cluster else set()
    pool = redis.ConnectionPool.from_url(
        cfg.url, **{key: value for key, value in options.items() if key not in own}
    )
    try:
        pool.make_connection()  # made, not connected
    except TypeError as exc:
        raise ConfigError(
            f"STREAMREC_STORE__CLIENT holds an option redis-py does not take ({exc}): fix or remove it "
            "(the options are redis.Redis's keyword arguments)"
        ) from exc
    return options


def store_client(
    cfg: RedisStoreConfig, options: dict[str, Any], decode_responses: bool = False
) -> redis.Redis | RedisCluster:
    """A client of the store's Redis: standalone, or the Cluster ``cfg.url`` names a node of.

    ``options`` are `client_options`'s. A Cluster's client connects as it is made (to read the
    slots): make it when first used, so that a process started before its Cluster is up waits
    for it in its outage handling, as for a standalone Redis.

    Raises:
        redis.RedisError: no node answered as a Cluster node: a `redis.ConnectionError` when
            none answered, a `redis.AuthenticationError` when one refused the user, a plain
            `redis.RedisError` otherwise (one answered without Cluster mode), its cause
            redis-py's. redis-py's own error is no `redis.RedisError`, so it would pass each
            caller's outage handling, and it tells none of these apart but by its cause.
    """
    if not cfg.cluster:
        return redis.Redis.from_url(cfg.url, decode_responses=decode_responses, **options)
    try:
        return RedisCluster.from_url(cfg.url, decode_responses=decode_responses, **options)
    except RedisClusterException as exc:
        cause = exc.__cause__
        kind = (redis.ConnectionError if isinstance(cause, NO_ANSWER + (OSError,))
                else redis.AuthenticationError if isinstance(cause, REFUSED) else redis.RedisError)
        raise kind(
            f"no Redis Cluster answered at {redact_url(cfg.url)} "
            f"(STREAMREC_STORE__URL, STREAMREC_STORE__CLUSTER): {exc}"
        ) from (cause or exc)


# The options redis-py gives a socket's settimeout.
_TIMEOUTS = ("socket_timeout", "socket_connect_timeout")


def _a_timeout(value: object) -> bool:
    """Whether a socket takes ``value`` as its timeout (``None``: none); not 0: non-blocking."""
    if value is None:
        return True
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= MAX_SECONDS
