"""One typed, frozen configuration, read from flags, ``STREAMREC_*`` env vars and ``streamrec.toml``.

Nested sections use ``__`` in env names: ``STREAMREC_KAFKA__BOOTSTRAP_SERVERS=host:9092``,
``STREAMREC_LEARNER__INTERVAL_S=120``. Kafka and Redis client options pass through as dicts
(``STREAMREC_KAFKA__CLIENT='{"security.protocol": "SSL"}'``). The feature store is picked by
``STREAMREC_STORE__TYPE`` (``redis``, the default, or ``memory``).
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from streamrec.errors import ConfigError
from streamrec.features.schema import FeatureSchema, FeatureSpec

_SECTION = ConfigDict(frozen=True, extra="forbid")

#: The hashes a producer partitions keyed records by (`streamrec.kafka.partitioning`).
Partitioner = Literal["murmur2", "crc32"]
#: librdkafka's ``partitioner`` for each: keyed records as the named hash puts them, records
#: without a key at random (as the Java client does).
LIBRDKAFKA_PARTITIONERS: dict[Partitioner, str] = {"murmur2": "murmur2_random", "crc32": "consistent_random"}


class KafkaConfig(BaseModel):
    """Broker address, topic names and pass-through client options (env ``STREAMREC_KAFKA__*``)."""

    model_config = _SECTION

    bootstrap_servers: str = Field("127.0.0.1:9092", description="STREAMREC_KAFKA__BOOTSTRAP_SERVERS")
    events_topic: str = Field("streamrec.events", description="STREAMREC_KAFKA__EVENTS_TOPIC")
    dlq_topic: str = Field("streamrec.events.dlq", description="STREAMREC_KAFKA__DLQ_TOPIC")
    samples_topic: str = Field("streamrec.samples", description="STREAMREC_KAFKA__SAMPLES_TOPIC")
    samples_dlq_topic: str = Field(
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
    session_timeout_ms: int = Field(6000, ge=1000, description="STREAMREC_KAFKA__SESSION_TIMEOUT_MS")
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


class RedisStoreConfig(BaseModel):
    """The Redis feature store, the default (env ``STREAMREC_STORE__*``)."""

    model_config = _SECTION

    type: Literal["redis"] = Field("redis", description="STREAMREC_STORE__TYPE")
    # 6380, not 6379, so the embedded Redis never collides with a system one.
    url: str = Field("redis://127.0.0.1:6380/0", description="STREAMREC_STORE__URL")
    cluster: bool = Field(False, description="STREAMREC_STORE__CLUSTER: url names a Cluster node")
    key_prefix: str = Field("sr", description="STREAMREC_STORE__KEY_PREFIX")
    # Users idle for 30 days lose their sequence: bounds memory on a long-running store. The
    # TTL is set on a user's first event and refreshed each time the user's event time enters
    # a new quarter of it (not at every batch: each refresh is a Redis command per key), so an
    # active user's keys expire 3/4 to 1 TTL after their last event.
    ttl_s: int = Field(30 * 86400, ge=1, description="STREAMREC_STORE__TTL_S")
    client: dict[str, Any] = Field(
        default_factory=dict, description="STREAMREC_STORE__CLIENT: extra redis-py options"
    )
    # A Redis that never answered since the process started is a wrong URL or a Redis not
    # started, not an outage: the consumers say so after this long instead of waiting out
    # STREAMREC_CONSUMER__RETRY_DEADLINE_S. 5 s is ample for a connection across a data centre.
    connect_timeout_s: float = Field(5.0, gt=0, description="STREAMREC_STORE__CONNECT_TIMEOUT_S")

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, url: str) -> str:
        if urlsplit(url).scheme not in _REDIS_SCHEMES:
            raise ValueError(
                f"the Redis URL {redact_url(url)!r} must start with redis://, rediss:// or unix:// "
                "(STREAMREC_STORE__URL, or --redis-url)"
            )
        return url


# The schemes redis-py's from_url takes.
_REDIS_SCHEMES = ("redis", "rediss", "unix")


def redact_url(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***``: fit for an error message."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return parts._replace(netloc=user + parts.netloc.rpartition("@")[2]).geturl()


class MemoryStoreConfig(BaseModel):
    """The in-process store (``STREAMREC_STORE__TYPE=memory``).

    Nothing is shared or kept, so it suits one-process runs, backtests and tests only.
    """

    model_config = _SECTION

    type: Literal["memory"] = Field("memory", description="STREAMREC_STORE__TYPE")


def _store_type(value: Any) -> str:
    """The store a section names; ``redis`` when it names none (env vars may set only a URL)."""
    if isinstance(value, dict):
        return str(value.get("type", "redis"))
    return str(getattr(value, "type", "redis"))


# Chosen by its ``type`` field, as feast picks an online store.
StoreConfig = Annotated[
    Annotated[RedisStoreConfig, Tag("redis")] | Annotated[MemoryStoreConfig, Tag("memory")],
    Discriminator(_store_type),
]


class ConsumerConfig(BaseModel):
    """Event consumers: windowing, labels, negative sampling (env ``STREAMREC_CONSUMER__*``)."""

    model_config = _SECTION

    group_id: str = Field("streamrec-consumers", description="STREAMREC_CONSUMER__GROUP_ID")
    # Up to 5,000 events a batch: the transaction commit and the batch's bookkeeping are paid
    # once a batch, and a user's events of one batch are one Redis update. On the Taobao slice
    # (bench/consumer_throughput.py) 5,000 ran 17-29% faster than 2,000 and as fast as
    # 10,000. A batch is cut at ``batch_timeout_s`` too: light traffic waits no longer.
    batch_size: int = Field(5000, ge=1, description="STREAMREC_CONSUMER__BATCH_SIZE")
    batch_timeout_s: float = Field(0.5, gt=0, description="STREAMREC_CONSUMER__BATCH_TIMEOUT_S")
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
    # Shares of the negatives drawn from the recent items of the user's own history categories
    # and from the user's own history (an item acted on before, not the target), the rest from
    # the global pools above. A global-only sampler makes "the target is in the history" and
    # "the target's category is the user's" label tells no real impression log has; a feed
    # whose retrieval shows the user's categories and re-shows items has exposures like these
    # (bench/sampler_agreement.py measures which mix ranks strategies as true labels do).
    negative_category_share: float = Field(
        0.0, ge=0.0, le=1.0, description="STREAMREC_CONSUMER__NEGATIVE_CATEGORY_SHARE"
    )
    negative_history_share: float = Field(
        0.0, ge=0.0, le=1.0, description="STREAMREC_CONSUMER__NEGATIVE_HISTORY_SHARE"
    )
    max_event_bytes: int = Field(16_384, ge=64, description="STREAMREC_CONSUMER__MAX_EVENT_BYTES")
    # Half of Kafka's default 1 MB record limit leaves room for the headers a dead letter
    # adds and for brokers configured below the default; longer values are cut (with their
    # length and sha256 in headers).
    dead_letter_max_bytes: int = Field(
        512 * 1024, ge=1024, description="STREAMREC_CONSUMER__DEAD_LETTER_MAX_BYTES"
    )
    # Clock skew allowance: an event more than 5 minutes in the future is rejected.
    max_future_ms: int = Field(300_000, ge=0, description="STREAMREC_CONSUMER__MAX_FUTURE_MS")
    seed: int = Field(0, description="STREAMREC_CONSUMER__SEED (negative sampling)")
    # An event more than this behind the newest event time seen on its partition is late.
    # One hour is the negative window: a sample that late would draw negatives from pools
    # that no longer cover its time, and the learner has long trained on what came after
    # it. It is generous to producers that buffer, retry or interleave for minutes, and well
    # inside the dedup horizon, so a resend an hour late still counts as a duplicate.
    # None (null): nothing is late; 0: any event older than one before it on its partition.
    allowed_lateness_ms: int | None = Field(
        3_600_000, ge=0, description="STREAMREC_CONSUMER__ALLOWED_LATENESS_MS (null: off)"
    )
    # A late event is real behaviour: "sequence_only" keeps it in its user's sequence, so
    # later histories (and a store rebuilt from the events topic) hold it, but emits no
    # sample of it (its model has seen its future). "dead_letter" sends it to the DLQ,
    # reason "late event ...", and leaves the sequences without it.
    late_events: Literal["sequence_only", "dead_letter"] = Field(
        "sequence_only", description="STREAMREC_CONSUMER__LATE_EVENTS"
    )
    # "sampled": implicit positives (positive_actions) with sampled negatives, for click-only
    # logs. "join": a feed that logs what it showed; an impression (impression_action) opens
    # a window of label_window_ms of event time; a click on the same user and item inside it
    # makes the impression a positive at once; the watermark (allowed_lateness_ms) passing
    # the window's end without one makes it a negative. A click without an open impression
    # falls back to the "sampled" rule. Needs a watermark (allowed_lateness_ms not null).
    labels: Literal["sampled", "join"] = Field("sampled", description="STREAMREC_CONSUMER__LABELS")
    impression_action: str = Field(
        "impression", min_length=1, description="STREAMREC_CONSUMER__IMPRESSION_ACTION (join)"
    )
    # Half an hour: clicks follow what a feed shows within seconds to minutes; a negative is
    # emitted label_window_ms + allowed_lateness_ms of event time after its impression.
    label_window_ms: int = Field(1_800_000, ge=1, description="STREAMREC_CONSUMER__LABEL_WINDOW_MS")
    # How long a batch is redone after Redis or the broker failed before the consumer stops:
    # five minutes rides out a restart or a failover, and still alerts on a real outage.
    retry_deadline_s: float = Field(300.0, ge=0, description="STREAMREC_CONSUMER__RETRY_DEADLINE_S")
    # An event id yields its samples once per user within this much of the user's event time.
    # Six hours covers producer retries and an application resending after an outage, at
    # about 100 bytes of Redis per event remembered.
    dedup_horizon_ms: int = Field(
        6 * 3_600_000, ge=0, description="STREAMREC_CONSUMER__DEDUP_HORIZON_MS"
    )
    # User features (role ``user``): the newest points (event time, value) kept per user and
    # feature. Every point counts, a repeat of the value before too (dropping one is wrong once
    # a late point lands between), so a feature sent with every event keeps the user's last 16
    # events' values: a sample reads it exactly unless its event is 16 of its user's events
    # late, for ~25 bytes a point (streamrec.featurestore.profiles).
    profile_points: int = Field(16, ge=1, description="STREAMREC_CONSUMER__PROFILE_POINTS")
    stop_when_idle_s: float | None = Field(
        None, description="STREAMREC_CONSUMER__STOP_WHEN_IDLE_S: stop after this long without events"
    )
    # Prometheus's exporter range; one consumer per host gets it, others set their own (0: off).
    metrics_port: int = Field(9465, ge=0, le=65535, description="STREAMREC_CONSUMER__METRICS_PORT (0: off)")

    @model_validator(mode="after")
    def _negative_shares_fit(self) -> ConsumerConfig:
        total = self.negative_category_share + self.negative_history_share
        if total > 1.0 + 1e-9:  # a float sum such as 0.7 + 0.3 may land a hair above 1
            raise ValueError(
                f"STREAMREC_CONSUMER__NEGATIVE_CATEGORY_SHARE ({self.negative_category_share:g}) plus "
                f"STREAMREC_CONSUMER__NEGATIVE_HISTORY_SHARE ({self.negative_history_share:g}) is "
                f"{total:g}: they are shares of the negatives and must sum to at most 1 (the rest "
                "are drawn from the global pools)"
            )
        return self

    @model_validator(mode="after")
    def _join_needs_a_watermark(self) -> ConsumerConfig:
        if self.labels == "join":
            if self.allowed_lateness_ms is None:
                raise ValueError(
                    "labels='join' needs a watermark to close impression windows: set "
                    "STREAMREC_CONSUMER__ALLOWED_LATENESS_MS to a number of milliseconds"
                )
            if self.impression_action in self.positive_actions:
                raise ValueError(
                    f"impression_action {self.impression_action!r} is also a positive action"
                )
        return self


#: A table's feature: ``item``, ``category``, ``user`` (the user id) or a declared feature's name.
Feature = str
#: Features seen both as the target and along the behaviour sequence (DIN attends over them).
BEHAVIOUR_FEATURES: tuple[Feature, ...] = ("item", "category")
#: The features of the event contract itself; a table of any other embeds a declared feature.
BUILTIN_TABLE_FEATURES: tuple[Feature, ...] = ("item", "category", "user")


class TableConfig(BaseModel):
    """One embedding table, as torchrec's ``EmbeddingBagConfig``.

    The feature whose ids it embeds, its rows and its width, and how ids get rows.

    ``item`` and ``category`` are behaviour features: the table embeds the target's id and
    every id along the behaviour sequence, and DIN attends over them. ``user`` is a context
    feature: embedded once per sample and fed to the MLP head.

    Any other ``feature`` names a declared feature (``STREAMREC_FEATURES``); ``also`` names
    more declared features that share the table's rows (a ``genres`` and a ``main_genre``, say).
    A declared feature's table is hashed (``ids="hashed"``); a declared feature with no table
    here gets a hashed one of its own (`streamrec.learner.features`).

    ``ids="dynamic"`` (the default, `streamrec.learner.idmap`): an id seen ``min_count``
    times as a target (or as the context) gets a row of its own, so ids never share one;
    until then it uses the table's learned default row. The table starts at
    ``initial_rows`` and doubles as ids arrive, up to ``rows``; an id unseen for ``ttl_s``
    of event time gives its row back for reuse. ``ids="hashed"``: ids hash into exactly
    ``rows`` rows, fixed memory, and unrelated ids share rows.
    """

    model_config = _SECTION

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    feature: Feature = Field(pattern=r"^[a-z][a-z0-9_]*$")
    # More declared features embedded in this table (declared features' tables only).
    also: tuple[str, ...] = ()
    ids: Literal["dynamic", "hashed"] = "dynamic"
    # The most rows, padding (row 0) and, for dynamic tables, the default row (1) included.
    rows: int = Field(ge=3)
    dim: int = Field(16, ge=1)
    # Measured with the backtester (README, "The model"): an id's own row from its first
    # sighting scored best on MovieLens and Taobao; 2 or 3 lost up to 0.1 GAUC on Taobao,
    # where a target seen once before is common and its one sample tells.
    min_count: int = Field(1, ge=1)
    # None: rows are taken back only when the table is full (the least recently seen ids
    # first). A TTL suits a catalogue with steady churn (30 days for a shop); on MovieLens,
    # whose ratings are sparse over 22 years, a 30-day TTL cost 0.05 GAUC.
    ttl_s: float | None = Field(None, gt=0)
    initial_rows: int = Field(4096, ge=3)

    @property
    def start_rows(self) -> int:
        """The rows the table starts with."""
        return self.rows if self.ids == "hashed" else min(self.initial_rows, self.rows)


# What a model configuration saved before a setting existed implies for it (a snapshot's
# manifest keeps the model's settings): the model was built without it.
MODEL_SETTINGS_BEFORE: dict[str, object] = {"match_features": False}
# Settings that only start a model (or place it): a snapshot loads whatever they are, so a
# snapshot that does not load is never down to them.
MODEL_SETTINGS_INIT_ONLY: frozenset[str] = frozenset({"device", "seed", "match_init"})


class ModelConfig(BaseModel):
    """DIN hyper-parameters (env ``STREAMREC_MODEL__*``)."""

    model_config = _SECTION

    # Which model learns: a built-in by its short name, or a user's own class by its import
    # path, as feast loads backends (see streamrec.learner.registry).
    learner: str = Field(
        "din",
        min_length=1,
        description=(
            "STREAMREC_MODEL__LEARNER (a built-in: din or deepfm; or your own learner class as "
            "package.module:ClassName)"
        ),
    )

    # Items: a dynamic table, starting small and growing with the ids in use, up to 2^21 (about
    # 250 bytes a row with Adam, 450 with EWC, at D=16: ~0.5-0.9 GB when full). Categories: a
    # hashed table of 2^16 rows (~14 MB with Adam), so every category has its row from its first
    # event, where a dynamic table gives a new id the shared default row until a micro-batch
    # has been learnt (and the match features read zero for all of the first one). Taobao's
    # full dataset has ~9.4k categories: ~13% of them share a row with another, which costs
    # little as a category's row is a coarse signal. Before this default the category table was
    # dynamic: STREAMREC_MODEL__TABLES='[{"name": "item", "feature": "item", "rows": 2097152},
    # {"name": "category", "feature": "category", "rows": 65536}]' resumes such a snapshot.
    # Adding a table (a user table, say) is a change here, not in the code.
    tables: tuple[TableConfig, ...] = Field(
        (
            TableConfig(name="item", feature="item", rows=2**21, dim=16),
            TableConfig(name="category", feature="category", ids="hashed", rows=2**16, dim=16),
        ),
        description=(
            "STREAMREC_MODEL__TABLES (JSON list of {name, feature, rows, dim, ids, min_count, "
            "ttl_s, initial_rows, also}; feature: item, category, user or a declared feature, "
            "also: more declared features sharing the table)"
        ),
    )
    # Behaviours per sample: the consumers keep and emit each user's latest this many, and
    # the model reads as many. DIN papers use 20-100; 50 is the measured sweet spot of cost
    # and recall.
    sequence_length: int = Field(50, ge=1, description="STREAMREC_MODEL__SEQUENCE_LENGTH")
    # A bias per id of each table, added to the logit (see learner.model.WideArch), learning
    # this many times faster than the rest.
    wide: bool = Field(True, description="STREAMREC_MODEL__WIDE")
    id_stats: bool = Field(True, description="STREAMREC_MODEL__ID_STATS")
    # The target's share and count in its own history, per behaviour table (see
    # learner.model.MatchArch): the head's inputs and a fast linear term of the logit.
    match_features: bool = Field(True, description="STREAMREC_MODEL__MATCH_FEATURES")
    match_lr_scale: float = Field(10.0, gt=0, description="STREAMREC_MODEL__MATCH_LR_SCALE")
    # The weight each behaviour table's share feature starts at in the logit: 0 learns it from
    # nothing, as every other weight; 1, with the hashed category table, ranks by the category
    # match from the first event (Taobao first quarter GAUC 0.798 -> 0.829; MovieLens, where
    # genres tell little, 0.001 lower: a near-tie). Initialisation only: snapshots load
    # whatever it is.
    match_init: float = Field(1.0, description="STREAMREC_MODEL__MATCH_INIT")
    wide_lr_scale: float = Field(10.0, gt=0, description="STREAMREC_MODEL__WIDE_LR_SCALE")
    attention_units: tuple[int, ...] = Field((64, 32), description="STREAMREC_MODEL__ATTENTION_UNITS")
    mlp_units: tuple[int, ...] = Field((128, 64), description="STREAMREC_MODEL__MLP_UNITS")
    learning_rate: float = Field(1e-3, gt=0, description="STREAMREC_MODEL__LEARNING_RATE")
    train_batch_size: int = Field(256, ge=1, description="STREAMREC_MODEL__TRAIN_BATCH_SIZE")
    passes: int = Field(1, ge=1, description="STREAMREC_MODEL__PASSES over each micro-batch")
    # Online EWC (learner.ewc): lambda 0 is plain fine-tuning. gamma is how much of the
    # Fisher estimate carries into the next micro-batch; normalising each micro-batch's Fisher
    # to a mean of 1 makes lambda independent of the loss's scale. The default came out of
    # the backtester's sweep (README, "Online EWC").
    ewc_lambda: float = Field(0.0, ge=0, description="STREAMREC_MODEL__EWC_LAMBDA (0: off)")
    ewc_gamma: float = Field(0.9, ge=0, le=1, description="STREAMREC_MODEL__EWC_GAMMA")
    ewc_normalise: bool = Field(True, description="STREAMREC_MODEL__EWC_NORMALISE")
    seed: int = Field(0, description="STREAMREC_MODEL__SEED")
    device: str = Field("auto", description="STREAMREC_MODEL__DEVICE: auto, cpu or gpu[:N]")

    @model_validator(mode="after")
    def _tables_fit_din(self) -> ModelConfig:
        names = [t.name for t in self.tables]
        features = [f for t in self.tables for f in (t.feature, *t.also)]
        if len(set(names)) != len(names) or len(set(features)) != len(features):
            raise ValueError(f"table names and features must be unique: {names} / {features}")
        for t in self.tables:
            if t.feature in BUILTIN_TABLE_FEATURES and t.also:
                raise ValueError(f"table {t.name}: only a declared feature's table can be shared (also)")
            if t.feature not in BUILTIN_TABLE_FEATURES and t.ids != "hashed":
                raise ValueError(f"table {t.name}: a declared feature's table must be ids='hashed'")
        if not any(f in BEHAVIOUR_FEATURES for f in features):
            raise ValueError(f"DIN needs a behaviour table (one of {BEHAVIOUR_FEATURES})")
        return self

    def table(self, feature: Feature) -> TableConfig | None:
        """The table embedding ``feature``, if any."""
        return next((t for t in self.tables if feature in (t.feature, *t.also)), None)

    @property
    def builtin_tables(self) -> tuple[TableConfig, ...]:
        """The tables of the event contract's features (item, category, user), in order."""
        return tuple(t for t in self.tables if t.feature in BUILTIN_TABLE_FEATURES)


class LearnerConfig(BaseModel):
    """The micro-batch learner loop and its snapshots (env ``STREAMREC_LEARNER__*``)."""

    model_config = _SECTION

    group_id: str = Field("streamrec-learner", description="STREAMREC_LEARNER__GROUP_ID")
    # A few minutes per micro-batch: fresh enough for trends, large enough for stable steps.
    interval_s: float = Field(180.0, gt=0, description="STREAMREC_LEARNER__INTERVAL_S")
    max_batch_samples: int = Field(200_000, ge=1, description="STREAMREC_LEARNER__MAX_BATCH_SAMPLES")
    min_batch_samples: int = Field(1, ge=1, description="STREAMREC_LEARNER__MIN_BATCH_SAMPLES")
    # A micro-batch of fewer samples is too small to judge a model by (its AUC is noise, or
    # undefined): it is trained, but its figures are reported as too small and left out of
    # summaries, and the gate judges no version by it. Backtests cut by count fold a last
    # micro-batch this small into the one before.
    min_eval_samples: int = Field(200, ge=1, description="STREAMREC_LEARNER__MIN_EVAL_SAMPLES")
    snapshot_dir: Path = Field(Path("snapshots"), description="STREAMREC_LEARNER__SNAPSHOT_DIR")
    snapshot_every: int = Field(10, ge=1, description="STREAMREC_LEARNER__SNAPSHOT_EVERY micro-batches")
    # Retention: versions kept after each snapshot besides every promoted one; 0 keeps all.
    # Ten recent versions to compare or fall back to, at ten snapshots' disk, not unbounded.
    keep_snapshots: int = Field(10, ge=0, description="STREAMREC_LEARNER__KEEP_SNAPSHOTS (0: keep all)")
    # Every K-th snapshot is full, the ones between hold only the rows changed since the one
    # before (delta snapshots). Ten bounds a load to one full and nine small files, and what
    # retention must keep for a chain to about twice keep_snapshots; 1 writes every one full.
    full_snapshot_every: int = Field(
        10, ge=1, description="STREAMREC_LEARNER__FULL_SNAPSHOT_EVERY (1: every snapshot full)"
    )
    # A snapshot resuming at samples the topic no longer holds (expired or deleted) is an
    # error by default: those samples were never trained. True skips them with a warning.
    allow_sample_gaps: bool = Field(False, description="STREAMREC_LEARNER__ALLOW_SAMPLE_GAPS")
    # Micro-batches in a row whose training went non-finite before the learner stops: one
    # is a bad batch, three in a row is a broken model or stream that needs a person.
    max_bad_batches: int = Field(3, ge=1, description="STREAMREC_LEARNER__MAX_BAD_BATCHES")
    stop_when_idle_s: float | None = Field(
        None, description="STREAMREC_LEARNER__STOP_WHEN_IDLE_S: stop after this long without samples"
    )
    metrics_port: int = Field(9464, ge=0, le=65535, description="STREAMREC_LEARNER__METRICS_PORT (0: off)")
    # Each snapshot is exported for Paddle Inference, and promoted to serving when it holds
    # against the served version on the next micro-batch (streamrec.serving.gate):
    # "gate" (that check), "always" (every snapshot), "off" (only `streamrec snapshot promote`).
    promote: Literal["gate", "always", "off"] = Field("gate", description="STREAMREC_LEARNER__PROMOTE")
    # The gate: the candidate's AUC at least the served one's minus this, and its logloss at
    # most the served one's times the ratio, both on the same, unseen micro-batch.
    gate_auc_margin: float = Field(0.002, ge=0, description="STREAMREC_LEARNER__GATE_AUC_MARGIN")
    gate_logloss_ratio: float = Field(1.01, ge=1, description="STREAMREC_LEARNER__GATE_LOGLOSS_RATIO")


class ServingConfig(BaseModel):
    """``streamrec serve`` and ``streamrec score`` (env ``STREAMREC_SERVING__*``).

    They read the promoted version of ``STREAMREC_LEARNER__SNAPSHOT_DIR``.
    """

    model_config = _SECTION

    host: str = Field("127.0.0.1", description="STREAMREC_SERVING__HOST")
    port: int = Field(8000, ge=0, le=65535, description="STREAMREC_SERVING__PORT")
    # How often the server looks at the serving pointer; a new version loads beside the old.
    poll_s: float = Field(1.0, gt=0, description="STREAMREC_SERVING__POLL_S")
    # Threads of one Paddle Inference run: 1 keeps a request's latency steady beside others.
    threads: int = Field(1, ge=1, description="STREAMREC_SERVING__THREADS")
    max_candidates: int = Field(1000, ge=1, description="STREAMREC_SERVING__MAX_CANDIDATES per request")
    # Threads that score requests beside the event loop: one scores while another reads a
    # user's sequence from the feature store (a predictor runs one request at a time).
    workers: int = Field(2, ge=1, description="STREAMREC_SERVING__WORKERS")
    # Score requests admitted at once, waiting or scoring; one more gets 503 with Retry-After
    # at once. 64 is about a quarter second of work at 4 ms a request.
    max_in_flight: int = Field(64, ge=1, description="STREAMREC_SERVING__MAX_IN_FLIGHT")
    # The longest an admitted request waits for a worker before it gets 503 with Retry-After:
    # past it, an answer is worth less than the client's retry elsewhere.
    max_queue_wait_s: float = Field(0.5, gt=0, description="STREAMREC_SERVING__MAX_QUEUE_WAIT_S")
    # A request body past this gets 413 before more is read: 1,000 candidates and a history of
    # 50 take about 40 KB, so 1 MiB leaves room and keeps a huge body out of memory.
    max_body_bytes: int = Field(1 << 20, ge=1, description="STREAMREC_SERVING__MAX_BODY_BYTES")
    # How long one feature-store check answers /readyz: a probe storm costs one Redis round
    # trip a second at most.
    ready_cache_s: float = Field(1.0, gt=0, description="STREAMREC_SERVING__READY_CACHE_S")
    # How long /readyz waits for that check; a store slower than this is reported not ready.
    ready_timeout_s: float = Field(1.0, gt=0, description="STREAMREC_SERVING__READY_TIMEOUT_S")

    @model_validator(mode="after")
    def _in_flight_covers_workers(self) -> ServingConfig:
        if self.max_in_flight < self.workers:
            raise ValueError(
                f"max_in_flight ({self.max_in_flight}) must be at least workers ({self.workers})"
            )
        return self


class ServicesConfig(BaseModel):
    """The embedded broker and Redis that ``streamrec up`` starts (env ``STREAMREC_SERVICES__*``)."""

    model_config = _SECTION

    host: str = Field("127.0.0.1", description="STREAMREC_SERVICES__HOST")
    kafka_port: int = Field(9092, ge=1, le=65535, description="STREAMREC_SERVICES__KAFKA_PORT")
    redis_port: int = Field(6380, ge=1, le=65535, description="STREAMREC_SERVICES__REDIS_PORT")
    state_dir: Path = Field(Path(".streamrec"), description="STREAMREC_SERVICES__STATE_DIR (pids, logs)")
    # None: Redis keeps nothing (development, tests). A directory: Redis keeps an append-only
    # file there and its data survives restarts. The embedded broker keeps nothing either way.
    data_dir: Path | None = Field(None, description="STREAMREC_SERVICES__DATA_DIR (Redis AOF)")
    start_timeout_s: float = Field(20.0, gt=0, description="STREAMREC_SERVICES__START_TIMEOUT_S")


class StreamrecConfig(BaseSettings):
    """The whole configuration; every component takes its own section."""

    model_config = SettingsConfigDict(
        env_prefix="STREAMREC_",
        env_nested_delimiter="__",
        toml_file="streamrec.toml",
        frozen=True,
        extra="forbid",
        env_parse_none_str="null",  # STREAMREC_CONSUMER__ALLOWED_LATENESS_MS=null: off
    )

    log_level: str = Field("INFO", description="STREAMREC_LOG_LEVEL")
    kafka: KafkaConfig = KafkaConfig()
    store: StoreConfig = RedisStoreConfig()
    consumer: ConsumerConfig = ConsumerConfig()
    model: ModelConfig = ModelConfig()
    learner: LearnerConfig = LearnerConfig()
    services: ServicesConfig = ServicesConfig()
    serving: ServingConfig = ServingConfig()
    # The features beyond item and category, in order (streamrec.features): a JSON list in
    # STREAMREC_FEATURES, or [[features]] tables in streamrec.toml.
    features: tuple[FeatureSpec, ...] = Field((), description="STREAMREC_FEATURES")

    @model_validator(mode="after")
    def _schema_holds(self) -> StreamrecConfig:
        self.feature_schema()  # two features with one name or one field: refused here, named
        return self

    def feature_schema(self) -> FeatureSchema:
        """The deployment's feature schema: item and category, then ``features``."""
        return FeatureSchema.of(self.features)

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


def load_config(toml_file: Path | None = None, **overrides: Any) -> StreamrecConfig:
    """Build the config; ``overrides`` are nested dicts by section (``kafka={"partitions": 2}``).

    A section given here is merged over what env and TOML say for that section. The TOML file
    is ``toml_file`` when given (it must exist), else ``./streamrec.toml`` if there is one.

    Raises:
        ConfigError: A setting is invalid; the message names its env variable.

    Examples:
        >>> load_config(consumer={"batch_size": 500}).consumer.batch_size
        500
        >>> load_config(consumer={"batch_size": 0})
        Traceback (most recent call last):
        ...
        streamrec.errors.ConfigError: invalid setting STREAMREC_CONSUMER__BATCH_SIZE ...
    """
    toml_path = Path(toml_file or str(StreamrecConfig.model_config.get("toml_file")))
    try:
        if toml_file is not None and not toml_file.is_file():
            raise ConfigError(f"the settings file {toml_file} does not exist: give an existing TOML file")
        base = StreamrecConfig() if toml_file is None else _reading(toml_file)()
        if not overrides and toml_file is None:
            return base
        merged = base.model_dump()
        for section, values in overrides.items():
            current = merged.get(section)
            # A section that switches its type (the store) starts afresh instead of merging.
            if (
                isinstance(values, dict)
                and isinstance(current, dict)
                and values.get("type", current.get("type")) == current.get("type")
            ):
                merged[section] = {**current, **values}
            else:
                merged[section] = values
        return StreamrecConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError("; ".join(_setting_error(error) for error in exc.errors())) from exc
    except SettingsError as exc:
        raise _source_error(exc) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{toml_path.resolve()} is not valid TOML: {exc}: fix the file") from exc


def _reading(toml_file: Path) -> type[StreamrecConfig]:
    """The configuration class, reading ``toml_file`` instead of ``./streamrec.toml``.

    `load_config` validates the result again as a `StreamrecConfig`.
    """

    class FromFile(StreamrecConfig):
        model_config = SettingsConfigDict(toml_file=toml_file)

    return FromFile


def env_name(loc: tuple[int | str, ...]) -> str:
    """The env var of a setting at ``loc`` (pydantic's error location).

    ``("consumer", "batch_size")`` is ``STREAMREC_CONSUMER__BATCH_SIZE``; an item of a list is
    named by its list's variable and its place in it.

    Examples:
        >>> env_name(("consumer", "batch_size"))
        'STREAMREC_CONSUMER__BATCH_SIZE'
        >>> env_name(("model", "tables", 0, "rows"))
        'STREAMREC_MODEL__TABLES (item 0 rows)'
    """
    parts = list(loc)
    if parts[:1] == ["store"] and parts[1:2] in (["redis"], ["memory"]):
        del parts[1]  # the discriminated union's tag is no setting
    item = next((i for i, part in enumerate(parts) if isinstance(part, int)), len(parts))
    name = "STREAMREC_" + "__".join(str(part).upper() for part in parts[:item])
    inside = " ".join(str(part) for part in parts[item:])
    return f"{name} (item {inside})" if inside else name


def _setting_error(error: Any) -> str:
    """One pydantic error as the setting it is about and what is wrong with it."""
    message = str(error["msg"]).removeprefix("Value error, ")
    value = error.get("input")
    shown = f", got {value!r}" if isinstance(value, str | int | float) and len(repr(value)) <= 80 else ""
    if str(error["type"]) == "value_error":
        shown = ""  # our own checks name what they found
    name = env_name(tuple(error["loc"]))
    return f"invalid setting {name} (or its flag or streamrec.toml entry): {message}{shown}"


def _source_error(exc: SettingsError) -> ConfigError:
    """A settings value that could not be read, as one clear line.

    A value pydantic-settings could not read (JSON in an env var) as one line naming the
    variable and the position.
    """
    cause = exc.__cause__
    if isinstance(cause, json.JSONDecodeError):
        names = [k for k, v in os.environ.items() if k.upper().startswith("STREAMREC_") and v == cause.doc]
        where = " or ".join(names) or "a STREAMREC_* variable"
        return ConfigError(
            f"{where} is not valid JSON: {cause.msg} at line {cause.lineno} column {cause.colno} "
            f"(char {cause.pos}): fix its value"
        )
    return ConfigError(f"invalid configuration: {exc}")
