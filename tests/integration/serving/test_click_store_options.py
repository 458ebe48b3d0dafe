"""Serve's click join reaches the feature store's Redis as the store does: with its client options.

Found by the settings tour: `start_click_join` made its own client from ``STREAMREC_STORE__URL``
alone, so ``STREAMREC_STORE__CLIENT`` (a password, a user, TLS options) and the store's 5 s
socket timeout were not applied: on a Redis that wants a password given there the feature
store worked and every served list's record failed (NOAUTH), and a hung Redis could hold a
request's click record without end.
"""

from __future__ import annotations

from collections.abc import Callable

import redis

from streamrec.config import StreamrecConfig
from streamrec.serving.clicks import start_click_join
from tests.integration.conftest import PrivateService


def test_the_click_join_takes_the_stores_client_options(
    private_redis: PrivateService, pipeline_config: Callable[..., StreamrecConfig], unique_name: str
) -> None:
    redis.Redis(port=private_redis.port).config_set("requirepass", "secret")
    store = {
        "url": f"redis://127.0.0.1:{private_redis.port}/0", "key_prefix": unique_name,
        "client": {"password": "secret"},
    }
    # A group of its own: the join's consumer leaves as it is still joining, and the embedded
    # broker then holds the group's next members (test_clicks.py's) past their 30 s wait.
    cfg = pipeline_config(store=store, serving={"click_join": True, "click_group": f"clicks-{unique_name}"})
    join, consumer = start_click_join(cfg)
    try:
        client = join.client
        assert isinstance(client, redis.Redis) and client.ping()
        options = client.connection_pool.connection_kwargs
        assert options["socket_timeout"] == 5.0  # the store's own default, not none
    finally:
        consumer.stop()
        redis.Redis(port=private_redis.port, password="secret").config_set("requirepass", "")
