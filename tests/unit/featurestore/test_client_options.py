"""A timeout in ``STREAMREC_STORE__CLIENT`` that no socket takes is named as the store is made.

Found by the settings tour: ``STREAMREC_STORE__CLIENT='{"socket_timeout": "x"}'`` passed the
options check (redis-py takes any value and uses it when it connects), and the consumers'
first connection died on a ``TypeError`` traceback in ``sock.settimeout``; ``1e300`` on an
``OverflowError``, and ``-1`` on a ``ValueError``.
"""

from __future__ import annotations

import pytest

from streamrec.config import RedisStoreConfig
from streamrec.config.section import MAX_SECONDS
from streamrec.errors import ConfigError
from streamrec.featurestore.redis_options import client_options


@pytest.mark.parametrize("name", ["socket_timeout", "socket_connect_timeout"])
@pytest.mark.parametrize("value", ["x", 1e300, -1, 0, True, float("nan")])
def test_a_timeout_no_socket_takes_is_named(name: str, value: object) -> None:
    cfg = RedisStoreConfig(client={name: value})
    with pytest.raises(ConfigError, match=f"STREAMREC_STORE__CLIENT {name}"):
        client_options(cfg)


@pytest.mark.parametrize("value", [None, 0.5, 3, MAX_SECONDS])
def test_a_timeout_a_socket_takes_passes(value: object) -> None:
    assert client_options(RedisStoreConfig(client={"socket_timeout": value}))["socket_timeout"] == value
