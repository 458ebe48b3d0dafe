"""The Redis store's pure parts; its behaviour against a real Redis is in tests/integration."""

from __future__ import annotations

import pytest

from streamrec.errors import FeatureStoreError
from streamrec.featurestore.redis_server import check_servers


def servers(*versions: str) -> list[dict[str, object]]:
    return [{"redis_version": v, "maxmemory": 0, "maxmemory_policy": "noeviction"} for v in versions]


def test_a_redis_older_than_6_2_is_refused_with_its_version() -> None:
    check_servers(servers("7.0.15", "6.2.0", "7.4.1-valkey", "10.0.0"))
    with pytest.raises(FeatureStoreError, match=r"redis 6\.0\.16 is too old .* needs 6\.2 or newer"):
        check_servers(servers("7.2.4", "6.0.16"))
    with pytest.raises(FeatureStoreError, match="5.0.7"):
        check_servers(servers("5.0.7"))
