"""Kafka client construction in one place: our defaults, then the user's pass-through options."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient

from streamrec.config import LIBRDKAFKA_PARTITIONERS, KafkaConfig
from streamrec.errors import ConfigError, ServiceError
from streamrec.kafka.records import Header
from streamrec.logs import RepeatedLines

logger = logging.getLogger(__name__)

# librdkafka's own log lines (disconnects, retries) go through logging, not raw stderr: the
# first of like lines each 30 s (a refused reconnect comes ~20 times a second while a broker is down).
client_logger = logging.getLogger("streamrec.kafka.client")
client_logger.addFilter(RepeatedLines())
# Time for a broker across a data centre to accept a connection, short enough that an
# operator with a wrong address hears about it at once.
CONNECT_TIMEOUT_S = 5.0


def produce(
    producer: Producer,
    topic: str,
    value: bytes | None,
    *,
    key: bytes | None = None,
    timestamp_ms: int = 0,
    headers: list[Header] | None = None,
    on_delivery: Callable[[KafkaError | None, Message], None] | None = None,
) -> None:
    """``producer.produce`` that waits while the local queue is full.

    ``producer.produce`` that waits (serving delivery reports) while the local queue is
    full, instead of raising BufferError; ``timestamp_ms`` 0 means "now".
    """
    while True:
        try:
            producer.produce(
                topic, value=value, key=key, timestamp=timestamp_ms, headers=headers,
                on_delivery=on_delivery,
            )
            return
        except BufferError:
            producer.poll(0.05)


def producer_config(cfg: KafkaConfig, **overrides: Any) -> dict[str, Any]:
    """Idempotent, fully acknowledged producer options."""
    conf: dict[str, Any] = {
        "bootstrap.servers": cfg.bootstrap_servers,
        "enable.idempotence": True,  # no duplicates or reordering on retry
        "acks": "all",
        # 5 ms of batching lifts throughput an order of magnitude at negligible latency.
        "linger.ms": 5,
        "compression.type": "lz4",
        "logger": client_logger,
    }
    if cfg.partitioner is not None:  # keyed records where every other producer puts them
        conf["partitioner"] = LIBRDKAFKA_PARTITIONERS[cfg.partitioner]
    conf.update(overrides)
    conf.update(cfg.client)
    return conf


def consumer_config(cfg: KafkaConfig, group_id: str, **overrides: Any) -> dict[str, Any]:
    """Manual-offset consumer options: offsets are stored only after their effect is durable."""
    conf: dict[str, Any] = {
        "bootstrap.servers": cfg.bootstrap_servers,
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": cfg.session_timeout_ms,
        "isolation.level": "read_committed",
        "enable.partition.eof": True,  # end-of-partition events feed event-time alignment
        "logger": client_logger,
    }
    conf.update(overrides)
    conf.update(cfg.client)
    return conf


def make_producer(cfg: KafkaConfig, **overrides: Any) -> Producer:
    """A producer with `producer_config`."""
    return Producer(producer_config(cfg, **overrides))


def make_consumer(cfg: KafkaConfig, group_id: str, **overrides: Any) -> Consumer:
    """A consumer with `consumer_config`."""
    return Consumer(consumer_config(cfg, group_id, **overrides))


def require_broker(cfg: KafkaConfig, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Return once a bootstrap server accepts a TCP connection and answers a metadata request.

    Else raise one clear line.

    librdkafka would retry for many seconds and log every refused connection, and an address
    that accepts connections but is no Kafka broker (or wants TLS) ends in a controller
    timeout: checking first tells the operator what is wrong before any client starts.
    """
    problems = []
    for server in cfg.bootstrap_servers.split(","):
        host, port = _host_port(server)
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                break
        except OSError as exc:
            problems.append((exc.strerror or str(exc) or type(exc).__name__).lower())
    else:
        raise ServiceError(
            f"Kafka broker at {cfg.bootstrap_servers} is unreachable: {'; '.join(dict.fromkeys(problems))}"
        )
    _require_answer(cfg, timeout_s)


def _require_answer(cfg: KafkaConfig, timeout_s: float) -> None:
    """Raise one line unless the brokers answer a metadata request within ``timeout_s``."""
    # The same pass-through options as every client (TLS, SASL, ...).
    conf = {"bootstrap.servers": cfg.bootstrap_servers, "logger": client_logger, **cfg.client}
    try:
        admin = AdminClient(conf)  # checks the options before any connection
    except KafkaException as exc:
        raise ConfigError(
            f"STREAMREC_KAFKA__CLIENT holds an option the Kafka client refuses ({_reason(exc)}): "
            "fix or remove it (the options are librdkafka's, CONFIGURATION.md)"
        ) from exc
    try:
        admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        reason = _reason(exc)
        raise ServiceError(
            f"Kafka broker at {cfg.bootstrap_servers} accepted a connection but did not answer a Kafka "
            f"request within {timeout_s:g} s ({reason}): check that STREAMREC_KAFKA__BOOTSTRAP_SERVERS "
            "(--bootstrap-servers) names a Kafka broker's listener, and the security options in "
            "STREAMREC_KAFKA__CLIENT"
        ) from exc


def _reason(exc: KafkaException) -> str:
    """What librdkafka said, without the error code's name."""
    error = exc.args[0] if exc.args else exc
    return error.str() if isinstance(error, KafkaError) else str(error)


def _host_port(server: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or ``PROTOCOL://host:port`` as a socket address."""
    address = server.strip().rpartition("://")[2]
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port or 9092)
