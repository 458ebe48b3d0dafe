"""The learner section: the micro-batch loop, its snapshots and the promotion gate."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from streamrec.config.section import MAX_SECONDS, SECTION, GroupId, NonEmptyPath


class LearnerConfig(BaseModel):
    """The micro-batch learner loop and its snapshots (env ``STREAMREC_LEARNER__*``)."""

    model_config = SECTION

    group_id: GroupId = Field("streamrec-learner", description="STREAMREC_LEARNER__GROUP_ID")
    # A few minutes per micro-batch: fresh enough for trends, large enough for stable steps.
    interval_s: float = Field(180.0, gt=0, le=MAX_SECONDS, description="STREAMREC_LEARNER__INTERVAL_S")
    # While a micro-batch is gathered, the samples so far are scored then trained every
    # part_s (streamrec.learner.parts), so only the last part is left to train at the close.
    # 20 s: at the default interval and 300 events/s (540 samples/s) that last part trains in
    # ~6 s on 2 shared cores, inside the freshness goal of interval + 30 s with room for the
    # snapshot and the export; shorter parts only add a short mini-batch each. A part_s at
    # least the interval trains each micro-batch whole, at its close. Ranks agree on each
    # part's end (streamrec.learner.ranked).
    part_s: float = Field(20.0, gt=0, le=MAX_SECONDS, description="STREAMREC_LEARNER__PART_S")
    # A part also ends once it holds this many samples: a backlog fills a micro-batch in
    # seconds, and a part's samples are decoded into Python objects (~7 KB each at the default
    # 50 behaviours) before they are trained. 20,000 bounds that to ~0.2 GB and ~2 s of
    # training; the micro-batch, its report and its snapshot are unchanged.
    max_part_samples: int = Field(20_000, ge=1, description="STREAMREC_LEARNER__MAX_PART_SAMPLES")
    max_batch_samples: int = Field(200_000, ge=1, description="STREAMREC_LEARNER__MAX_BATCH_SAMPLES")
    min_batch_samples: int = Field(1, ge=1, description="STREAMREC_LEARNER__MIN_BATCH_SAMPLES")
    # A micro-batch of fewer samples is too small to judge a model by (its AUC is noise, or
    # undefined): it is trained, but its figures are reported as too small and left out of
    # summaries, and the gate judges no version by it. Backtests cut by count fold a last
    # micro-batch this small into the one before.
    min_eval_samples: int = Field(200, ge=1, description="STREAMREC_LEARNER__MIN_EVAL_SAMPLES")
    snapshot_dir: NonEmptyPath = Field(Path("snapshots"), description="STREAMREC_LEARNER__SNAPSHOT_DIR")
    snapshot_every: int = Field(10, ge=1, description="STREAMREC_LEARNER__SNAPSHOT_EVERY micro-batches")
    # Retention: versions kept after each snapshot besides the served one, as many served before
    # it (rollback's targets) and chains they need; 0 keeps all. Ten recent versions to
    # compare or fall back to, at ten snapshots' disk, not unbounded.
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
    # A samples topic created again since the snapshot (a new topic id): its offsets start
    # over, so it is an error by default; True trains the model on from the new topic's first
    # sample, with a warning.
    resume_on_new_topic: bool = Field(False, description="STREAMREC_LEARNER__RESUME_ON_NEW_TOPIC")
    # Micro-batches in a row whose training went non-finite before the learner stops: one
    # is a bad batch, three in a row is a broken model or stream that needs a person.
    max_bad_batches: int = Field(3, ge=1, description="STREAMREC_LEARNER__MAX_BAD_BATCHES")
    stop_when_idle_s: float | None = Field(
        None, gt=0, le=MAX_SECONDS,
        description="STREAMREC_LEARNER__STOP_WHEN_IDLE_S: stop after this long without samples"
    )
    metrics_port: int = Field(9464, ge=0, le=65535, description="STREAMREC_LEARNER__METRICS_PORT (0: off)")
    metrics_host: str = Field(
        "0.0.0.0", min_length=1,
        description="STREAMREC_LEARNER__METRICS_HOST: /metrics listens on it (0.0.0.0: every interface)",
    )
    # Each snapshot is exported for Paddle Inference, and promoted to serving when it holds
    # against the served version on the next micro-batch (streamrec.serving.gate):
    # "gate" (that check), "always" (every snapshot), "off" (only `streamrec snapshot promote`).
    promote: Literal["gate", "always", "off"] = Field("gate", description="STREAMREC_LEARNER__PROMOTE")
    # The gate: the candidate's AUC at least the served one's minus this, and its logloss at
    # most the served one's times the ratio, both on the same, unseen micro-batch.
    gate_auc_margin: float = Field(0.002, ge=0, description="STREAMREC_LEARNER__GATE_AUC_MARGIN")
    gate_logloss_ratio: float = Field(1.01, ge=1, description="STREAMREC_LEARNER__GATE_LOGLOSS_RATIO")
    # Several learner ranks (``streamrec learner run --workers N``, or under
    # ``paddle.distributed.launch``): how long a rank waits for the others in one micro-batch's
    # exchanges before it leaves (exit status 75), so a group with a frozen or lost rank stops
    # instead of hanging; above interval_s plus the longest step. Inside a training step's
    # collective gloo's own 30 s applies (docs/operating/learner-ranks.md).
    rank_timeout_s: float = Field(
        600.0, gt=0, le=MAX_SECONDS, description="STREAMREC_LEARNER__RANK_TIMEOUT_S"
    )
