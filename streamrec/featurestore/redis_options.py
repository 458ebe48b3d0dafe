"""The Redis clients' options: the defaults, the connect timeout and ``STREAMREC_STORE__CLIENT``.

redis-py makes its connections when first used, so an option it does not take would fail there,
deep in the first command (a ``TypeError`` traceback at a consumer's attach, or at each
``/score``): it is checked here, as the store is made, instead.
"""

from __future__ import annotations

import inspect
from typing import Any

import redis
from redis.cluster import RedisCluster

from streamrec.config import RedisStoreConfig
from streamrec.errors import ConfigError
from streamrec.featurestore.redis_server import CLIENT_DEFAULTS


def client_options(cfg: RedisStoreConfig) -> dict[str, Any]:
    """The options a store's client is made with, each one checked.

    Raises:
        ConfigError: an option of ``STREAMREC_STORE__CLIENT`` that no connection to ``cfg.url``
            takes, named.
    """
    options = {**CLIENT_DEFAULTS, "socket_connect_timeout": cfg.connect_timeout_s, **cfg.client}
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
