"""Health probes of the local services: does the broker serve metadata, does Redis answer PING."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import redis
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from redis.backoff import NoBackoff
from redis.retry import Retry

from streamrec.local.ports import address, tcp_reachable

# Local services answer in milliseconds; 2 s only leaves room for a loaded CI machine.
PROBE_TIMEOUT_S = 2.0


def kafka_healthy(host: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a broker on ``host:port`` answers a metadata request."""
    if not tcp_reachable(host, port, timeout_s):
        return False  # checked first: librdkafka would log connection errors to stderr
    admin = AdminClient({"bootstrap.servers": address(host, port)})
    try:
        admin.list_topics(timeout=timeout_s)
    except KafkaException:
        return False
    return True


def redis_healthy(host: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a Redis on ``host:port`` answers PING (one try: redis-py retries by default)."""
    if not tcp_reachable(host, port, timeout_s):
        return False
    client = redis.Redis(
        host=host,
        port=port,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def redis_keeps(host: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> Path | None:
    """Where a Redis on ``host:port`` keeps its append-only file; None when it keeps nothing.

    Raises:
        redis.RedisError: it did not answer.
    """
    client = redis.Redis(
        host=host, port=port, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0), decode_responses=True,
    )
    try:
        settings = client.config_get("appendonly") | client.config_get("dir")
        return Path(str(settings["dir"])) if settings.get("appendonly") == "yes" else None
    finally:
        client.close()


HEALTH: dict[str, Callable[[str, int, float], bool]] = {
    "kafka": kafka_healthy,
    "redis": redis_healthy,
}
