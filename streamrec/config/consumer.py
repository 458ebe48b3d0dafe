"""The event consumers' section: windowing, labels, negative sampling."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from streamrec.config.section import MAX_SECONDS, SECTION, GroupId

# Sampled negatives a positive, at most. Pointwise recommenders draw a few: NCF found 3-6 best
# (He et al. 2017), word2vec advises 5-20, 2-5 on large data (Mikolov et al. 2013), DIN's Taobao
# data is 1:1. 100 is a 5,000-event batch of 505,000 samples (~780 MiB, ~3 s to draw), some 50 s
# of the learner's ~10,000 samples/s; 1,000 was 5 million samples (7.6 GiB, 96 s to draw, deaf to
# a stop meanwhile), and the draw grows with its square (docs/concepts/labels.md).
MAX_NEGATIVES = 100


class ConsumerConfig(BaseModel):
    """Event consumers: windowing, labels, negative sampling (env ``STREAMREC_CONSUMER__*``)."""

    model_config = SECTION

    group_id: GroupId = Field("streamrec-consumers", description="STREAMREC_CONSUMER__GROUP_ID")
    # Up to 5,000 events a batch: the transaction commit and the batch's bookkeeping are paid
    # once a batch, and a user's events of one batch are one Redis update. On the Taobao slice
    # (bench/consumer_throughput.py) 5,000 ran 17-29% faster than 2,000 and as fast as
    # 10,000. A batch is cut at ``batch_timeout_s`` too: light traffic waits no longer, and at
    # librdkafka's 1,000,000 records a consume call (`streamrec.kafka.source.MAX_CONSUME`).
    batch_size: int = Field(5000, ge=1, description="STREAMREC_CONSUMER__BATCH_SIZE")
    batch_timeout_s: float = Field(
        0.5, gt=0, le=MAX_SECONDS, description="STREAMREC_CONSUMER__BATCH_TIMEOUT_S"
    )
    positive_actions: tuple[str, ...] = Field(
        ("pv", "click"), description="STREAMREC_CONSUMER__POSITIVE_ACTIONS (implicit positives)"
    )
    # At most MAX_NEGATIVES a positive (see there): more is no recommender's practice and more
    # samples a batch than the learner trains in a minute.
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
    retry_deadline_s: float = Field(
        300.0, ge=0, le=MAX_SECONDS, description="STREAMREC_CONSUMER__RETRY_DEADLINE_S"
    )
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
    # late (a batch's own points are all read, however many), for ~25 bytes a point
    # (streamrec.featurestore.profiles).
    profile_points: int = Field(16, ge=1, description="STREAMREC_CONSUMER__PROFILE_POINTS")
    stop_when_idle_s: float | None = Field(
        None, gt=0, le=MAX_SECONDS,
        description="STREAMREC_CONSUMER__STOP_WHEN_IDLE_S: stop after this long without events"
    )
    # Prometheus's exporter range; one consumer per host gets it, others set their own (0: off).
    metrics_port: int = Field(9465, ge=0, le=65535, description="STREAMREC_CONSUMER__METRICS_PORT (0: off)")
    metrics_host: str = Field(
        "0.0.0.0", min_length=1,
        description="STREAMREC_CONSUMER__METRICS_HOST: /metrics listens on it (0.0.0.0: every interface)",
    )

    @field_validator("negatives")
    @classmethod
    def _negatives_are_few(cls, negatives: int) -> int:
        if negatives > MAX_NEGATIVES:
            raise ValueError(
                f"{negatives:,} is more than the {MAX_NEGATIVES} a positive allowed (recommenders "
                "draw a few, 1-20; each is a sample to build, send and train, so "
                f"{MAX_NEGATIVES} already makes a batch's samples {MAX_NEGATIVES + 1} times its clicks)"
            )
        return negatives

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
