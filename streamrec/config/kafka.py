"""The Kafka section: broker, topics, partitioning and client options."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field, model_validator

from streamrec.config.section import SECTION

#: The hashes a producer partitions keyed records by (`streamrec.kafka.partitioning`).
Partitioner = Literal["murmur2", "crc32"]
#: librdkafka's ``partitioner`` for each: keyed records as the named hash puts them, records
#: without a key at random (as the Java client does).
LIBRDKAFKA_PARTITIONERS: dict[Partitioner, str] = {"murmur2": "murmur2_random", "crc32": "consistent_random"}


def _topic_name(name: str) -> str:
    """``name`` if Kafka takes it as a topic name (the local broker takes any, a cluster not)."""
    if not _TOPIC.fullmatch(name) or name in (".", ".."):
        raise ValueError(
            f"{name!r} is no Kafka topic name: 1 to 249 of the letters a-z and A-Z, digits, '.', '_' and "
            "'-', and not '.' or '..'"
        )
    return name


_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")  # Kafka's own rule (org.apache.kafka.common.internals.Topic)
TopicName = Annotated[str, AfterValidator(_topic_name)]
# librdkafka's default max.poll.interval.ms, which a session timeout may not exceed.
_POLL_INTERVAL_MS = 300_000


class KafkaConfig(BaseModel):
    """Broker address, topic names and pass-through client options (env ``STREAMREC_KAFKA__*``)."""

    model_config = SECTION

    bootstrap_servers: str = Field("127.0.0.1:9092", description="STREAMREC_KAFKA__BOOTSTRAP_SERVERS")
    events_topic: TopicName = Field("streamrec.events", description="STREAMREC_KAFKA__EVENTS_TOPIC")
    dlq_topic: TopicName = Field("streamrec.events.dlq", description="STREAMREC_KAFKA__DLQ_TOPIC")
    samples_topic: TopicName = Field("streamrec.samples", description="STREAMREC_KAFKA__SAMPLES_TOPIC")
    samples_dlq_topic: TopicName = Field(
        "streamrec.samples.dlq", description="STREAMREC_KAFKA__SAMPLES_DLQ_TOPIC (the learner's)"
    )
    # Partitions bound consumer parallelism; 4 lets a few consumer processes share the load.
    partitions: int = Field(4, ge=1, description="STREAMREC_KAFKA__PARTITIONS (topics we create)")
    # -1 takes the broker's default.replication.factor (1 on a single embedded broker); set 3
    # on a production cluster, with min.insync.replicas=2 in topic_config.
    replication_factor: int = Field(-1, ge=-1, description="STREAMREC_KAFKA__REPLICATION_FACTOR")
    topic_config: dict[str, str] = Field(
        default_factory=dict,
        description="STREAMREC_KAFKA__TOPIC_CONFIG: for every topic we create, e.g. min.insync.replicas",
    )
    # A feature store that lost its data is rebuilt from the events topic: keep events as
    # long as the sequences live (the store's TTL, 30 days).
    events_retention_ms: int = Field(
        30 * 86_400_000, ge=-1, description="STREAMREC_KAFKA__EVENTS_RETENTION_MS (-1: forever)"
    )
    # The learner reads samples within minutes; a week leaves room to replay or restore.
    samples_retention_ms: int = Field(
        7 * 86_400_000, ge=-1, description="STREAMREC_KAFKA__SAMPLES_RETENTION_MS (-1: forever)"
    )
    # Dead letters wait for a person: a month to look at them.
    dead_letter_retention_ms: int = Field(
        30 * 86_400_000, ge=-1, description="STREAMREC_KAFKA__DEAD_LETTER_RETENTION_MS (-1: forever)"
    )
    # A group join takes about half of session.timeout.ms on the local broker; 6 s keeps
    # restarts quick while tolerating a GC pause. Raise it on a busy production cluster.
    # librdkafka takes at most an hour, and no more than max.poll.interval.ms (5 minutes unless
    # STREAMREC_KAFKA__CLIENT sets it): a longer one was a KafkaException traceback at start.
    session_timeout_ms: int = Field(
        6000, ge=1000, le=3_600_000, description="STREAMREC_KAFKA__SESSION_TIMEOUT_MS"
    )
    # Partitions of one consumer are kept within a minute of event time of each other while
    # catching up: tight against windows of minutes, loose enough to rarely pause when live.
    max_skew_ms: int | None = Field(
        60_000, ge=0, description="STREAMREC_KAFKA__MAX_SKEW_MS (null: no alignment)"
    )
    # A broker stall shorter than this is ridden out by calling again; a longer one makes the
    # broker abort the consumers' open transaction and the batch is redone. It also bounds how
    # long a consumer killed mid-transaction blocks read_committed readers (on Apache Kafka).
    transaction_timeout_ms: int = Field(
        60_000, ge=1000, description="STREAMREC_KAFKA__TRANSACTION_TIMEOUT_MS"
    )
    # No partition waits longer than this (wall clock) for the others: catching up, event
    # time runs far faster than the clock, so only skewed timestamps ever wait this long.
    max_hold_ms: int = Field(300_000, ge=0, description="STREAMREC_KAFKA__MAX_HOLD_MS")
    # Every producer of the events topic must put each user in one partition, by one
    # partitioner; murmur2 is the Java client's, which Kafka Streams, Connect, aiokafka and
    # kafka-python use too (streamrec's producers follow this setting, librdkafka's default
    # is crc32). The consumers dead-letter records it does not put where they are.
    partitioner: Partitioner | None = Field(
        "murmur2",
        description="STREAMREC_KAFKA__PARTITIONER: murmur2 (the Java client's), crc32 "
        "(librdkafka's default), or null (records unchecked: the producers' own rule)",
    )
    client: dict[str, Any] = Field(
        default_factory=dict, description="STREAMREC_KAFKA__CLIENT: extra librdkafka options"
    )

    @model_validator(mode="after")
    def _one_partitioner(self) -> KafkaConfig:
        # streamrec's producers partition by ``partitioner``, and the consumers check records
        # against it: a client option that partitions otherwise would have every record
        # these producers write dead-lettered.
        chosen = self.client.get("partitioner")
        if chosen is not None and self.partitioner is not None:
            wanted = LIBRDKAFKA_PARTITIONERS[self.partitioner]
            if chosen != wanted:
                raise ValueError(
                    f"STREAMREC_KAFKA__CLIENT sets partitioner={chosen}, but the consumers check "
                    f"records by STREAMREC_KAFKA__PARTITIONER={self.partitioner} ({wanted}): set "
                    "STREAMREC_KAFKA__PARTITIONER instead (murmur2, crc32, or null)"
                )
        return self

    @model_validator(mode="after")
    def _no_topic_written_as_another_read(self) -> KafkaConfig:
        # A dead-letter topic (or the samples topic) that is a topic streamrec reads feeds its
        # own output back: a bad sample dead-lettered into the samples topic was read, and
        # dead-lettered, again and again. The two dead-letter topics may be one.
        names = ("events_topic", "dlq_topic", "samples_topic", "samples_dlq_topic")
        for read in ("events_topic", "samples_topic"):
            for written in names:
                if written != read and getattr(self, written) == getattr(self, read):
                    raise ValueError(
                        f"STREAMREC_KAFKA__{written.upper()} and STREAMREC_KAFKA__{read.upper()} are both "
                        f"{getattr(self, read)!r}: streamrec would write into a topic it reads (a dead "
                        "letter read and dead-lettered again, for ever): give them different names"
                    )
        return self

    @model_validator(mode="after")
    def _session_within_poll_interval(self) -> KafkaConfig:
        raw = self.client.get("max.poll.interval.ms", _POLL_INTERVAL_MS)
        try:
            poll_ms = int(raw)
        except (TypeError, ValueError):
            return self  # not a number: the Kafka client names it (streamrec.kafka.clients)
        if self.session_timeout_ms > poll_ms:
            raise ValueError(
                f"STREAMREC_KAFKA__SESSION_TIMEOUT_MS ({self.session_timeout_ms}) is above the consumers' "
                f"max.poll.interval.ms ({poll_ms}), which the Kafka client refuses: lower it, or raise "
                "max.poll.interval.ms in STREAMREC_KAFKA__CLIENT"
            )
        return self

    @model_validator(mode="after")
    def _eager_rebalancing(self) -> KafkaConfig:
        # A consumer drops what it polled but did not commit when the group rebalances, and
        # relies on the rebalance restarting every partition it keeps from its committed
        # offset: only the eager protocol does. An incremental one keeps the positions of the
        # partitions it keeps, so those records would be skipped.
        strategy = str(self.client.get("partition.assignment.strategy", ""))
        if "cooperative" in strategy or str(self.client.get("group.protocol", "classic")) != "classic":
            raise ValueError(
                "streamrec's consumers need eager rebalancing (a rebalance restarts every partition "
                "from its committed offset): drop the cooperative partition.assignment.strategy or "
                "group.protocol from STREAMREC_KAFKA__CLIENT"
            )
        return self
