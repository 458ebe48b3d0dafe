"""The Redis store's markers: one key a primary that says the store still holds its data."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import redis
from redis.cluster import RedisCluster

from streamrec.errors import FeatureStoreLost

# How a rebuild's marker ends: the consumers tell a rebuild from a store started afresh.
REBUILT = " rebuilt"


def new_marker(rebuilt: bool = False) -> str:
    """A fresh marker value: random, dated, and saying whether a rebuild wrote it."""
    value = f"{uuid.uuid4().hex} {datetime.now(UTC).isoformat(timespec='seconds')}"
    return value + REBUILT if rebuilt else value


def marker_keys(client: redis.Redis | RedisCluster, prefix: str) -> list[str]:
    """``<prefix>:marker:{<tag>}``: one key, or one per Cluster primary."""
    if not isinstance(client, RedisCluster):
        return [f"{prefix}:marker:{{0}}"]
    wanted = {node.name for node in client.get_primaries()}
    keys: dict[str, str] = {}
    for tag in range(100_000):  # a few dozen tags cover a handful of primaries
        key = f"{prefix}:marker:{{{tag}}}"
        node = client.get_node_from_key(key)
        if node is not None and node.name in wanted and node.name not in keys:
            keys[node.name] = key
        if len(keys) == len(wanted):
            break
    return sorted(keys.values())


def check_markers(markers: dict[str, str] | None, values: list[Any], prefix: str) -> None:
    """Raise unless every marker still holds what ``RedisFeatureStore.attach`` found (``markers``)."""
    if markers is None or values == list(markers.values()):
        return
    where = f"the feature store at prefix {prefix!r}"
    if all(values) and all(str(v).endswith(REBUILT) for v in values):
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
