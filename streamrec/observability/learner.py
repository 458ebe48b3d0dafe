"""The learner's Prometheus metrics: progress, progressive quality, freshness, lag.

Fed from the runner's hooks (``on_report``, ``on_snapshot``); nothing here calls the runner.
Quality gauges hold the last micro-batch's progressive figures (scored before training on
it) and read NaN until the first one.

Dynamic embedding tables report per table (label ``table``): ids given a row, ids whose
row was taken back, ids refused a row (the table full), rows in use; a model with hashed
tables only reports none.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge, Histogram

from streamrec.observability.freshness import AgeHistogram, ages_s
from streamrec.observability.process import ProcessMetrics

if TYPE_CHECKING:  # the learner's modules import numpy and Kafka: only for the type checker
    from streamrec.learner.reports import MicroBatchReport
    from streamrec.snapshots.store import SnapshotManifest

PREFIX = "streamrec_learner"

# Training a micro-batch takes well under a second on a GPU and minutes on a CPU with the
# default 200k samples; 180 s is the default interval (a step slower than the interval falls
# behind the stream) and 600 s catches a step that is far too slow.
TRAIN_SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 180.0, 300.0, 600.0)
# Scoring is a forward pass only, a few times faster than training: the same range shifted down.
SCORE_SECONDS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 180.0)


class LearnerMetrics(ProcessMetrics):
    """The learner's metrics in a registry of their own (tests and the demo run several).

    ``clock`` gives wall-clock epoch seconds, to compare with event times for freshness.
    Closing it stops its server and its lag client.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        """Create every metric, unset quality gauges reading NaN."""
        super().__init__(PREFIX, "--metrics-port or STREAMREC_LEARNER__METRICS_PORT")
        self._clock = clock
        self._newest_event_s = math.nan
        self._counters()
        self._quality()
        self._freshness()
        self._tables()

    def _counter(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
        return Counter(f"{PREFIX}_{name}", doc, labels, registry=self.registry)

    def _gauge(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
        gauge = Gauge(f"{PREFIX}_{name}", doc, labels, registry=self.registry)
        if not labels:
            gauge.set(math.nan)  # "no value yet", not a misleading 0
        return gauge

    def _counters(self) -> None:
        self.micro_batches = self._counter("micro_batches_total", "Micro-batches trained")
        self.samples = self._counter("samples_trained_total", "Samples trained")
        self.dead_letters = self._counter(
            "dead_letters_total", "Sample records dead-lettered instead of trained on"
        )
        self.steps = self._counter("steps_total", "Optimizer steps attempted")
        self.skipped_steps = self._counter(
            "skipped_steps_total", "Optimizer steps skipped for a non-finite loss or gradient"
        )
        self.train_seconds = Histogram(
            f"{PREFIX}_train_seconds", "Seconds to train one micro-batch",
            buckets=TRAIN_SECONDS_BUCKETS, registry=self.registry,
        )
        self.score_seconds = Histogram(
            f"{PREFIX}_score_seconds", "Seconds to score one micro-batch before training on it",
            buckets=SCORE_SECONDS_BUCKETS, registry=self.registry,
        )
        self.snapshots = self._counter("snapshots_total", "Snapshots written")

    def _quality(self) -> None:
        self.auc = self._gauge("progressive_auc", "AUC of the last micro-batch, scored before training")
        self.gauc = self._gauge("progressive_gauc", "Per-user AUC weighted by samples, last micro-batch")
        self.logloss = self._gauge("progressive_logloss", "Log loss of the last micro-batch, before training")
        self.known_auc = self._gauge(
            "progressive_known_auc", "AUC over samples whose target item the model had seen"
        )
        self.novelty_auc = self._gauge(
            "progressive_novelty_auc", "AUC of 'target item is new' alone: near 0.5 means no sampler leak"
        )
        self.tell_history_auc = self._gauge(
            "progressive_tell_history_auc", "AUC of 'target in the user's history' alone: ~0.5: no leak"
        )
        self.tell_category_auc = self._gauge(
            "progressive_tell_category_auc", "AUC of the history's share in the target's category alone"
        )
        self.mean_prediction = self._gauge("mean_prediction", "Mean predicted probability, last micro-batch")
        self.positive_rate = self._gauge(
            "positive_rate", "Observed share of positive labels, last micro-batch"
        )
        self.calibration = self._gauge(
            "calibration_ratio", "Mean prediction over observed positive rate (1: calibrated)"
        )
        self.loss = self._gauge("loss", "Mean training loss of the last micro-batch's steps")

    def _freshness(self) -> None:
        self.newest_event = self._gauge(
            "newest_event_timestamp_seconds", "Event time of the newest sample trained, epoch seconds"
        )
        freshness = self._gauge("freshness_seconds", "Now minus the event time of the newest sample trained")
        freshness.set_function(self.freshness_seconds)
        self.snapshot_lag = self._gauge(
            "snapshot_lag_seconds", "Snapshot time minus the event time of the newest sample in it"
        )
        self.snapshot_time = self._gauge("snapshot_timestamp_seconds", "When the last snapshot was written")
        self.snapshot_version = self._gauge("snapshot_version", "Version of the last snapshot written")
        self.snapshot_bytes = self._gauge("snapshot_bytes", "Size of the last snapshot on disk")
        self.event_to_trained = AgeHistogram(
            f"{PREFIX}_event_to_trained_seconds",
            "Seconds from each sample's event time to the end of training on it", self.registry,
        )

    def _tables(self) -> None:
        self.penalty_share = self._gauge(
            "ewc_penalty_share", "Share of the training loss from the EWC penalty, last micro-batch"
        )
        self.ids_admitted = self._counter("ids_admitted_total", "Ids given an embedding row", ("table",))
        self.ids_evicted = self._counter(
            "ids_evicted_total", "Ids whose embedding row was taken back", ("table",)
        )
        self.ids_refused = self._counter(
            "ids_refused_total", "Ids due an embedding row that found none (table full)", ("table",)
        )
        self.rows_in_use = self._gauge("embedding_rows_in_use", "Embedding rows holding an id", ("table",))

    def observe_report(self, report: MicroBatchReport) -> None:
        """Count one trained micro-batch and set the quality and freshness gauges."""
        m = report.metrics
        self.micro_batches.inc()
        self.samples.inc(m.samples)
        self.dead_letters.inc(report.dead)
        self.steps.inc(report.steps)
        self.skipped_steps.inc(report.skipped_steps)
        self.train_seconds.observe(report.train_seconds)
        self.score_seconds.observe(report.score_seconds)
        for gauge, value in (
            (self.auc, m.auc), (self.gauc, m.gauc), (self.logloss, m.logloss),
            (self.known_auc, m.known_auc), (self.novelty_auc, m.novelty_auc),
            (self.tell_history_auc, m.tell_history_auc), (self.tell_category_auc, m.tell_category_auc),
            (self.mean_prediction, m.mean_prediction), (self.positive_rate, m.positive_rate),
            (self.calibration, calibration_ratio(m.mean_prediction, m.positive_rate)),
            (self.loss, report.loss), (self.penalty_share, report.penalty_share),
        ):
            gauge.set(value)
        self.event_to_trained.observe_many(ages_s(self._clock(), report.event_ts))
        newest = report.last_ts / 1000.0
        if not newest <= self._newest_event_s:  # NaN before the first report
            self._newest_event_s = newest
            self.newest_event.set(newest)
        for counter, counts in (
            (self.ids_admitted, report.ids_admitted), (self.ids_evicted, report.ids_evicted),
            (self.ids_refused, report.ids_refused),
        ):
            for table, count in counts.items():
                counter.labels(table).inc(count)
        for table, rows in report.embedding_rows.items():
            self.rows_in_use.labels(table).set(rows)

    def observe_resumed(self, manifest: SnapshotManifest, size_bytes: int | None = None) -> None:
        """Start from the snapshot resumed: its version, time and size, and its newest event time.

        So freshness and the snapshot's age are known from the start, and grow while this
        process trains nothing; it counts no snapshot written.
        """
        if manifest.newest_event_ms is not None:
            self._newest_event_s = manifest.newest_event_ms / 1000.0
            self.newest_event.set(self._newest_event_s)
        self._show_snapshot(manifest, size_bytes)

    def observe_snapshot(self, manifest: SnapshotManifest, size_bytes: int | None = None) -> None:
        """Count a written snapshot.

        Its lag is measured against the newest sample trained (unknown, and left as it was, when
        this process trained nothing yet).
        """
        self.snapshots.inc()
        self._show_snapshot(manifest, size_bytes)

    def _show_snapshot(self, manifest: SnapshotManifest, size_bytes: int | None) -> None:
        created = datetime.fromisoformat(manifest.created_at).timestamp()
        self.snapshot_version.set(manifest.version)
        self.snapshot_time.set(created)
        if not math.isnan(self._newest_event_s):
            self.snapshot_lag.set(created - self._newest_event_s)
        if size_bytes is not None:
            self.snapshot_bytes.set(size_bytes)

    def freshness_seconds(self) -> float:
        """Now minus the event time of the newest sample trained; NaN before the first."""
        return self._clock() - self._newest_event_s


def calibration_ratio(mean_prediction: float, positive_rate: float) -> float:
    """Mean prediction over the observed positive rate; NaN where the rate is 0 or unknown."""
    if not positive_rate > 0:
        return math.nan
    return mean_prediction / positive_rate
