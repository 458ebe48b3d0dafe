"""What the learner loop reports: each micro-batch's figures, and the runner's running totals.

A micro-batch is scored before it is trained on (progressive validation), so its report's
figures are out-of-sample; one log line carries them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from streamrec.errors import TrainingDiverged
from streamrec.learner.base import TrainResult
from streamrec.learner.metrics import MicroBatchMetrics
from streamrec.learner.scored import Scored

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MicroBatchReport:
    """Progressive-validation figures of one micro-batch (scored before training on it)."""

    index: int
    metrics: MicroBatchMetrics
    first_ts: int  # event-time range of the micro-batch's samples, epoch ms
    last_ts: int
    loss: float  # mean over the steps taken; NaN when every step was skipped
    score_seconds: float
    train_seconds: float
    dead: int = 0  # records of the micro-batch dead-lettered instead of trained on
    steps: int = 0  # optimizer steps attempted
    skipped_steps: int = 0  # steps skipped for a non-finite loss or gradient: a bad batch
    penalty_share: float = 0.0  # the EWC penalty's share of the training loss, 0..1
    # Per dynamic table: ids given a row, ids whose row was taken back, ids refused one
    # (the table full), and rows owned by ids afterwards.
    ids_admitted: Mapping[str, int] = field(default_factory=dict)
    ids_evicted: Mapping[str, int] = field(default_factory=dict)
    ids_refused: Mapping[str, int] = field(default_factory=dict)
    embedding_rows: Mapping[str, int] = field(default_factory=dict)
    min_eval_samples: int = 1  # fewer samples than this: too small to judge a model by
    # Every trained sample's event time, epoch ms (freshness: event → trained); empty if unknown.
    event_ts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), compare=False)

    @property
    def judged(self) -> bool:
        """Whether its figures judge a model: it held at least ``min_eval_samples``."""
        return self.metrics.samples >= self.min_eval_samples


@dataclass
class LearnerStats:
    """Running totals of one runner.

    ``micro_batches`` and ``samples_trained`` are restored from the snapshot it resumed; the
    others count this runner's life only.
    """

    micro_batches: int = 0
    samples_trained: int = 0
    last_metrics: dict[str, float] = field(default_factory=dict)
    dead: int = 0  # records dead-lettered to samples_dlq_topic
    bad_batches: int = 0  # micro-batches with a skipped (non-finite) step
    skipped_steps: int = 0
    newest_event_ms: int | None = None  # the newest event time trained on (restored too)


@dataclass(frozen=True)
class StepResult:
    """One micro-batch's step: its scores given before training, and what training did."""

    probs: np.ndarray
    known: np.ndarray
    train: TrainResult
    score_seconds: float
    train_seconds: float


def scored_report(
    index: int, scored: Scored, result: StepResult, dead: int, min_eval_samples: int
) -> MicroBatchReport:
    """The report of the ``index``-th micro-batch trained, logged on one line.

    Its figures are ``scored``'s (one batch's `Scored.of`, its parts' `Scored.concat`, several
    ranks' `gather_scores`); ``result`` gives the training figures and times.
    """
    metrics = MicroBatchMetrics.compute(
        scored.label, scored.probs, scored.users, scored.known, scored.features
    )
    train = result.train
    report = MicroBatchReport(
        index, metrics, int(scored.ts.min()), int(scored.ts.max()),
        train.loss, result.score_seconds, result.train_seconds,
        dead=dead, steps=train.steps, skipped_steps=train.skipped_steps,
        penalty_share=train.penalty_share, ids_admitted=train.ids_admitted,
        ids_evicted=train.ids_evicted, ids_refused=train.ids_refused,
        embedding_rows=train.rows_in_use,
        min_eval_samples=min_eval_samples, event_ts=scored.ts,
    )
    logger.info(
        "micro_batch index=%d samples=%d dead=%d auc=%.4f gauc=%.4f known_auc=%.4f "
        "novelty_auc=%.4f tell_history_auc=%.4f tell_category_auc=%.4f logloss=%.4f loss=%.4f "
        "penalty_share=%.4f steps=%d skipped_steps=%d "
        "score_seconds=%.3f train_seconds=%.3f ids_admitted=%d ids_evicted=%d ids_refused=%d "
        "judged=%s",
        report.index, metrics.samples, dead, metrics.auc, metrics.gauc, metrics.known_auc,
        metrics.novelty_auc, metrics.tell_history_auc, metrics.tell_category_auc, metrics.logloss,
        train.loss, report.penalty_share, train.steps,
        train.skipped_steps, report.score_seconds, report.train_seconds,
        sum(train.ids_admitted.values()), sum(train.ids_evicted.values()),
        sum(train.ids_refused.values()), report.judged,
    )
    return report


def count_bad(stats: LearnerStats, report: MicroBatchReport, in_row: int, limit: int) -> int:
    """Count ``report``'s skipped steps in ``stats``; the bad micro-batches now in a row.

    A micro-batch without skipped steps resets the count; ``limit`` in a row stop the learner.

    Raises:
        TrainingDiverged: This was the ``limit``-th bad micro-batch in a row.
    """
    if report.skipped_steps == 0:
        return 0
    in_row += 1
    stats.bad_batches += 1
    stats.skipped_steps += report.skipped_steps
    logger.warning(
        "bad micro_batch index=%d skipped_steps=%d steps=%d bad_in_row=%d max_bad_batches=%d",
        report.index, report.skipped_steps, report.steps, in_row, limit,
    )
    if in_row >= limit:
        raise TrainingDiverged(
            f"training was not finite in {in_row} micro-batches in a row "
            f"(up to micro-batch {report.index}: {report.skipped_steps} of {report.steps} "
            f"steps skipped); stopped before snapshotting it: restart from the last "
            f"snapshot, with a lower learning rate if this recurs"
        )
    return in_row
