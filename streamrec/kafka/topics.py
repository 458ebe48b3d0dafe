"""Topic creation: the events, dead-letter and samples topics, created idempotently."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient, ClusterMetadata, NewTopic

from streamrec.config import KafkaConfig
from streamrec.errors import ConfigError, ConsumeError, ServiceError
from streamrec.kafka.clients import client_logger, require_broker
from streamrec.kafka.records import Partition

logger = logging.getLogger(__name__)


class TopicSpec(NamedTuple):
    """How to create a topic: partitions, replication (-1: the broker's default) and configs."""

    partitions: int
    replication_factor: int = -1
    config: Mapping[str, str] = {}  # never mutated: a fresh dict is built per topic


def create_topics(
    bootstrap_servers: str,
    topics: Mapping[str, TopicSpec | int],
    timeout_s: float = 10,
    client: Mapping[str, Any] | None = None,
) -> None:
    """Create each topic (a spec, or just its partition count).

    An existing topic is left as it is; the log line names the topics created and those there.

    Raises ConfigError for a count below 1 (Tansu would accept 0) and ServiceError for any
    other failure, such as an unreachable broker.
    """
    specs = {name: s if isinstance(s, TopicSpec) else TopicSpec(s) for name, s in topics.items()}
    if bad := {name: s.partitions for name, s in specs.items() if s.partitions < 1}:
        raise ConfigError(f"partition counts must be at least 1: {bad}")
    if not specs:
        return
    # The same pass-through options as the producers and consumers (TLS, SASL, ...).
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap_servers, "logger": client_logger, **(client or {})}
    admin = AdminClient(conf)
    new = [
        NewTopic(name, s.partitions, replication_factor=s.replication_factor, config=dict(s.config))
        for name, s in specs.items()
    ]
    futures = admin.create_topics(new, operation_timeout=timeout_s, request_timeout=timeout_s)
    failures, created, existing = [], [], []
    for name, future in futures.items():
        try:
            future.result(timeout=timeout_s + 1)
            created.append(name)
        except KafkaException as exc:
            error = exc.args[0]
            if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                existing.append(name)
                continue
            failures.append(f"{name}: {error}")
        except Exception as exc:  # noqa: BLE001  # a timed-out future raises TimeoutError
            failures.append(f"{name}: {exc!r}")
    if failures:
        raise ServiceError(
            f"could not create topics on {bootstrap_servers}: " + "; ".join(failures)
        )
    told = (("created", created), ("existing", existing))  # an existing topic is left as it is
    outcome = [f"{key}={','.join(names)}" for key, names in told if names]
    logger.info("bootstrap=%s topics %s", bootstrap_servers, " ".join(outcome))


def ensure_topics(cfg: KafkaConfig) -> None:
    """Create the pipeline's topics unless they exist.

    Create the events and samples topics and their dead-letter topics unless they exist
    (idempotent), with the configured partitions, replication and retention; a broker that
    cannot be reached is one clear error, at once.
    """
    require_broker(cfg)
    create_topics(cfg.bootstrap_servers, topic_specs(cfg), client=cfg.client)


# Kafka's zero topic id: the broker names no id (older than Kafka 2.8, or it keeps none).
_NO_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"


def topic_id(cfg: KafkaConfig, topic: str, timeout_s: float = 10) -> str | None:
    """``topic``'s id on the brokers (KIP-516: a topic created again gets a new one), or None.

    None when the brokers keep no topic ids (Kafka before 2.8). Offsets alone cannot tell a
    topic created again from the one before: the new topic's offsets start at 0 again.

    Raises:
        ConsumeError: the brokers did not answer, or the topic is missing.
    """
    conf: dict[str, Any] = {"bootstrap.servers": cfg.bootstrap_servers, "logger": client_logger, **cfg.client}
    admin = AdminClient(conf)
    future = admin.describe_topics(TopicCollection([topic]), request_timeout=timeout_s)[topic]
    try:
        found = str(future.result(timeout=timeout_s + 1).topic_id)
    except KafkaException as exc:
        error = exc.args[0]
        if isinstance(error, KafkaError) and error.code() == KafkaError.UNSUPPORTED_VERSION:
            return None
        raise ConsumeError(f"cannot read the topic id of {topic}: {error}") from exc
    except Exception as exc:  # noqa: BLE001  # a timed-out future raises TimeoutError
        raise ConsumeError(f"cannot read the topic id of {topic}: {exc!r}") from exc
    return None if found in ("", "None", _NO_TOPIC_ID) else found


def topic_specs(cfg: KafkaConfig) -> dict[str, TopicSpec]:
    """The topics streamrec uses and how it creates them."""

    def spec(retention_ms: int) -> TopicSpec:
        config = {"retention.ms": str(retention_ms), **cfg.topic_config}
        return TopicSpec(cfg.partitions, cfg.replication_factor, config)

    return {
        cfg.events_topic: spec(cfg.events_retention_ms),
        cfg.dlq_topic: spec(cfg.dead_letter_retention_ms),
        cfg.samples_topic: spec(cfg.samples_retention_ms),
        cfg.samples_dlq_topic: spec(cfg.dead_letter_retention_ms),
    }


def expired_positions(
    positions: Mapping[Partition, int], earliest: Mapping[Partition, int]
) -> dict[Partition, tuple[int, int]]:
    """Positions a topic no longer holds: partition -> (position, the earliest offset left)."""
    return {
        key: (offset, earliest[key])
        for key, offset in positions.items()
        if key in earliest and offset < earliest[key]
    }


class MetadataClient(Protocol):
    """Any confluent-kafka client: each reads topic metadata."""

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        """The cluster's metadata: of ``topic`` only, or of every topic when it is None."""
        ...


def topic_partitions(client: MetadataClient, topic: str, timeout_s: float) -> list[int]:
    """The partitions ``topic`` has now.

    Raises:
        ConsumeError: the broker did not answer, or the topic is missing.
    """
    try:
        meta = client.list_topics(topic, timeout=timeout_s).topics.get(topic)
    except KafkaException as exc:
        raise ConsumeError(f"cannot read the partitions of {topic}: {exc}") from exc
    if meta is not None and meta.error is not None and meta.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
        raise ConsumeError(f"cannot read the partitions of {topic}: {meta.error.str()}")
    if meta is None or meta.error is not None or not meta.partitions:
        raise ConsumeError(f"topic {topic} does not exist on the brokers")
    return sorted(meta.partitions)


def partition_counts(client: MetadataClient, topics: Sequence[str], timeout_s: float) -> dict[str, int]:
    """How many partitions each topic has now (see `topic_partitions`)."""
    return {topic: len(topic_partitions(client, topic, timeout_s)) for topic in topics}
