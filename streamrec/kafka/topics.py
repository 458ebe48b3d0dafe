"""Topic creation: the events, dead-letter and samples topics, created idempotently."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from streamrec.config import KafkaConfig
from streamrec.errors import ConfigError, ServiceError
from streamrec.kafka.clients import client_logger, require_broker

logger = logging.getLogger(__name__)


def create_topics(
    bootstrap_servers: str,
    topics: dict[str, int],
    timeout_s: float = 10,
    client: Mapping[str, Any] | None = None,
) -> None:
    """Create each topic with its partition count; an existing topic counts as created.

    Raises ConfigError for a count below 1 (Tansu would accept 0) and ServiceError for any
    other failure, such as an unreachable broker.
    """
    if bad := {name: n for name, n in topics.items() if n < 1}:
        raise ConfigError(f"partition counts must be at least 1: {bad}")
    if not topics:
        return
    # The same pass-through options as the producers and consumers (TLS, SASL, ...).
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap_servers, "logger": client_logger, **(client or {})}
    admin = AdminClient(conf)
    new = [NewTopic(name, num_partitions=n) for name, n in topics.items()]
    futures = admin.create_topics(new, operation_timeout=timeout_s, request_timeout=timeout_s)
    failures = []
    for name, future in futures.items():
        try:
            future.result(timeout=timeout_s + 1)
        except KafkaException as exc:
            error = exc.args[0]
            if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            failures.append(f"{name}: {error}")
        except Exception as exc:  # noqa: BLE001  # a timed-out future raises TimeoutError
            failures.append(f"{name}: {exc!r}")
    if failures:
        raise ServiceError(
            f"could not create topics on {bootstrap_servers}: " + "; ".join(failures)
        )
    logger.info("bootstrap=%s topics=%s created", bootstrap_servers, ",".join(topics))


def ensure_topics(cfg: KafkaConfig) -> None:
    """Create the events and samples topics and their dead-letter topics unless they exist
    (idempotent); a broker that cannot be reached is one clear error, at once."""
    require_broker(cfg)
    create_topics(
        cfg.bootstrap_servers,
        {
            cfg.events_topic: cfg.partitions,
            cfg.dlq_topic: 1,
            cfg.samples_topic: cfg.partitions,
            cfg.samples_dlq_topic: 1,
        },
        client=cfg.client,
    )
