"""One typed, frozen configuration, read from flags, ``STREAMREC_*`` env vars and ``streamrec.toml``.

Nested sections use ``__`` in env names: ``STREAMREC_KAFKA__BOOTSTRAP_SERVERS=host:9092``,
``STREAMREC_LEARNER__INTERVAL_S=120``. Kafka and Redis client options pass through as dicts
(``STREAMREC_KAFKA__CLIENT='{"security.protocol": "SSL"}'``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from streamrec.errors import ConfigError

_SECTION = ConfigDict(frozen=True, extra="forbid")


class KafkaConfig(BaseModel):
    """Broker address, topic names and pass-through client options (env ``STREAMREC_KAFKA__*``)."""

    model_config = _SECTION

    bootstrap_servers: str = Field("127.0.0.1:9092", description="STREAMREC_KAFKA__BOOTSTRAP_SERVERS")
    events_topic: str = Field("streamrec.events", description="STREAMREC_KAFKA__EVENTS_TOPIC")
    dlq_topic: str = Field("streamrec.events.dlq", description="STREAMREC_KAFKA__DLQ_TOPIC")
    samples_topic: str = Field("streamrec.samples", description="STREAMREC_KAFKA__SAMPLES_TOPIC")
    # Partitions bound consumer parallelism; 4 lets a few consumer processes share the load.
    partitions: int = Field(4, ge=1, description="STREAMREC_KAFKA__PARTITIONS (topics we create)")
    # A group join takes about half of session.timeout.ms on the local broker; 6 s keeps
    # restarts quick while tolerating a GC pause. Raise it on a busy production cluster.
    session_timeout_ms: int = Field(6000, ge=1000, description="STREAMREC_KAFKA__SESSION_TIMEOUT_MS")
    # Partitions of one consumer are kept within a minute of event time of each other while
    # catching up: tight against windows of minutes, loose enough to rarely pause when live.
    max_skew_ms: int | None = Field(
        60_000, ge=0, description="STREAMREC_KAFKA__MAX_SKEW_MS (null: no alignment)"
    )
    client: dict[str, Any] = Field(
        default_factory=dict, description="STREAMREC_KAFKA__CLIENT: extra librdkafka options"
    )


class RedisConfig(BaseModel):
    """Feature-store connection (env ``STREAMREC_REDIS__*``)."""

    model_config = _SECTION

    # 6380, not 6379, so the embedded Redis never collides with a system one.
    url: str = Field("redis://127.0.0.1:6380/0", description="STREAMREC_REDIS__URL")
    cluster: bool = Field(False, description="STREAMREC_REDIS__CLUSTER: url names a Cluster node")
    key_prefix: str = Field("sr", description="STREAMREC_REDIS__KEY_PREFIX")
    # Users idle for 30 days lose their sequence: bounds memory on a long-running store.
    ttl_s: int = Field(30 * 86400, ge=1, description="STREAMREC_REDIS__TTL_S")
    client: dict[str, Any] = Field(
        default_factory=dict, description="STREAMREC_REDIS__CLIENT: extra redis-py options"
    )


class ConsumerConfig(BaseModel):
    """Event consumers: windowing, labels, negative sampling (env ``STREAMREC_CONSUMER__*``)."""

    model_config = _SECTION

    group_id: str = Field("streamrec-consumers", description="STREAMREC_CONSUMER__GROUP_ID")
    # 2000 events a batch amortises the Redis round trip and the transaction commit.
    batch_size: int = Field(2000, ge=1, description="STREAMREC_CONSUMER__BATCH_SIZE")
    batch_timeout_s: float = Field(0.5, gt=0, description="STREAMREC_CONSUMER__BATCH_TIMEOUT_S")
    # DIN papers use 20-100 behaviours; 50 is the measured sweet spot of cost and recall.
    sequence_length: int = Field(50, ge=1, description="STREAMREC_CONSUMER__SEQUENCE_LENGTH")
    positive_actions: tuple[str, ...] = Field(
        ("pv", "click"), description="STREAMREC_CONSUMER__POSITIVE_ACTIONS (implicit positives)"
    )
    negatives: int = Field(1, ge=0, description="STREAMREC_CONSUMER__NEGATIVES per implicit positive")
    # Known-item negatives come from the events of the last hour: recent popularity, the
    # distribution positive targets come from (a day-long horizon drifts from it).
    negative_window_ms: int = Field(3_600_000, ge=1, description="STREAMREC_CONSUMER__NEGATIVE_WINDOW_MS")
    # An item first seen less than 10 minutes ago counts as new: a learner cutting a
    # micro-batch every few minutes has not trained on it. New positives get new negatives.
    novelty_ms: int = Field(600_000, ge=1, description="STREAMREC_CONSUMER__NOVELTY_MS")
    negative_pool_size: int = Field(100_000, ge=1, description="STREAMREC_CONSUMER__NEGATIVE_POOL_SIZE")
    max_event_bytes: int = Field(16_384, ge=64, description="STREAMREC_CONSUMER__MAX_EVENT_BYTES")
    # Clock skew allowance: an event more than 5 minutes in the future is rejected.
    max_future_ms: int = Field(300_000, ge=0, description="STREAMREC_CONSUMER__MAX_FUTURE_MS")
    seed: int = Field(0, description="STREAMREC_CONSUMER__SEED (negative sampling)")
    idle_exit_s: float | None = Field(
        None, description="STREAMREC_CONSUMER__IDLE_EXIT_S: stop after this long without events"
    )


class ModelConfig(BaseModel):
    """DIN hyper-parameters (env ``STREAMREC_MODEL__*``)."""

    model_config = _SECTION

    embedding_dim: int = Field(16, ge=1, description="STREAMREC_MODEL__EMBEDDING_DIM")
    # Ids are hashed into fixed tables so a stream of new ids needs no vocabulary rebuild.
    # 2^18 buckets: under 10% of items share a bucket up to ~25k live items, and a snapshot
    # (weights + Adam moments) stays about 50 MB at D=16; raise it for large catalogues.
    item_buckets: int = Field(2**18, ge=2, description="STREAMREC_MODEL__ITEM_BUCKETS")
    category_buckets: int = Field(2**14, ge=2, description="STREAMREC_MODEL__CATEGORY_BUCKETS")
    sequence_length: int = Field(50, ge=1, description="STREAMREC_MODEL__SEQUENCE_LENGTH")
    attention_units: tuple[int, ...] = Field((64, 32), description="STREAMREC_MODEL__ATTENTION_UNITS")
    mlp_units: tuple[int, ...] = Field((128, 64), description="STREAMREC_MODEL__MLP_UNITS")
    learning_rate: float = Field(1e-3, gt=0, description="STREAMREC_MODEL__LEARNING_RATE")
    train_batch_size: int = Field(256, ge=1, description="STREAMREC_MODEL__TRAIN_BATCH_SIZE")
    passes: int = Field(1, ge=1, description="STREAMREC_MODEL__PASSES over each micro-batch")
    seed: int = Field(0, description="STREAMREC_MODEL__SEED")
    device: str = Field("auto", description="STREAMREC_MODEL__DEVICE: auto, cpu or gpu[:N]")


class LearnerConfig(BaseModel):
    """The micro-batch learner loop and its snapshots (env ``STREAMREC_LEARNER__*``)."""

    model_config = _SECTION

    group_id: str = Field("streamrec-learner", description="STREAMREC_LEARNER__GROUP_ID")
    # A few minutes per micro-batch: fresh enough for trends, large enough for stable steps.
    interval_s: float = Field(180.0, gt=0, description="STREAMREC_LEARNER__INTERVAL_S")
    max_batch_samples: int = Field(200_000, ge=1, description="STREAMREC_LEARNER__MAX_BATCH_SAMPLES")
    min_batch_samples: int = Field(1, ge=1, description="STREAMREC_LEARNER__MIN_BATCH_SAMPLES")
    snapshot_dir: Path = Field(Path("snapshots"), description="STREAMREC_LEARNER__SNAPSHOT_DIR")
    snapshot_every: int = Field(10, ge=1, description="STREAMREC_LEARNER__SNAPSHOT_EVERY micro-batches")
    idle_exit_s: float | None = Field(
        None, description="STREAMREC_LEARNER__IDLE_EXIT_S: stop after this long without samples"
    )


class ServicesConfig(BaseModel):
    """The embedded broker and Redis that ``streamrec up`` starts (env ``STREAMREC_SERVICES__*``)."""

    model_config = _SECTION

    host: str = Field("127.0.0.1", description="STREAMREC_SERVICES__HOST")
    kafka_port: int = Field(9092, ge=1, le=65535, description="STREAMREC_SERVICES__KAFKA_PORT")
    redis_port: int = Field(6380, ge=1, le=65535, description="STREAMREC_SERVICES__REDIS_PORT")
    state_dir: Path = Field(Path(".streamrec"), description="STREAMREC_SERVICES__STATE_DIR (pids, logs)")
    start_timeout_s: float = Field(20.0, gt=0, description="STREAMREC_SERVICES__START_TIMEOUT_S")


class StreamrecConfig(BaseSettings):
    """The whole configuration; every component takes its own section."""

    model_config = SettingsConfigDict(
        env_prefix="STREAMREC_",
        env_nested_delimiter="__",
        toml_file="streamrec.toml",
        frozen=True,
        extra="forbid",
    )

    log_level: str = Field("INFO", description="STREAMREC_LOG_LEVEL")
    kafka: KafkaConfig = KafkaConfig()
    redis: RedisConfig = RedisConfig()
    consumer: ConsumerConfig = ConsumerConfig()
    model: ModelConfig = ModelConfig()
    learner: LearnerConfig = LearnerConfig()
    services: ServicesConfig = ServicesConfig()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Precedence: explicit arguments, then env vars, then ``streamrec.toml``."""
        return init_settings, env_settings, TomlConfigSettingsSource(settings_cls)


def load_config(**overrides: Any) -> StreamrecConfig:
    """Build the config; ``overrides`` are nested dicts by section (``kafka={"partitions": 2}``).

    A section given here is merged over what env and TOML say for that section.
    """
    try:
        base = StreamrecConfig()
        if not overrides:
            return base
        merged = base.model_dump()
        for section, values in overrides.items():
            if isinstance(values, dict):
                merged[section] = {**merged[section], **values}
            else:
                merged[section] = values
        return StreamrecConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(f"invalid configuration: {exc}") from exc
