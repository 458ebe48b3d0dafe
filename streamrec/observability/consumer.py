"""The consumers' Prometheus metrics.

Events, samples, dead letters by reason, late events, batch time, lag.

Fed from `ConsumerRunner`'s ``on_batch`` hook, one
committed batch at a time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge, Histogram

from streamrec.deadletters import KINDS, reason_kind
from streamrec.observability.freshness import AgeHistogram, ages_s
from streamrec.observability.process import ProcessMetrics

if TYPE_CHECKING:  # the runner imports Redis and Kafka clients: only for the type checker
    from streamrec.consumers.native_runner import BatchReport

PREFIX = "streamrec_consumer"

# A healthy batch (up to 2000 events: one Redis round trip, one transaction) takes 5-500 ms;
# the upper buckets catch batches redone through an outage, up to the 300 s retry deadline.
BATCH_SECONDS_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0
)

class ConsumerMetrics(ProcessMetrics):
    """The consumers' metrics in a registry of their own (tests and the demo run several).

    Closing it stops its server and its lag client.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        """Create every metric; every dead-letter kind starts at 0, so rates exist at once.

        ``clock`` gives wall-clock epoch seconds, to compare with event times for freshness.
        """
        super().__init__(PREFIX, "--metrics-port or STREAMREC_CONSUMER__METRICS_PORT")
        self._clock = clock
        r = self.registry
        self.batches = Counter(f"{PREFIX}_batches_total", "Batches committed", registry=r)
        self.events = Counter(
            f"{PREFIX}_events_total", "Valid events consumed, duplicates included", registry=r
        )
        self.samples = Counter(f"{PREFIX}_samples_total", "Training samples emitted", registry=r)
        self.duplicates = Counter(
            f"{PREFIX}_duplicates_total", "Resent events that yielded nothing", registry=r
        )
        self.late = Counter(
            f"{PREFIX}_late_events_total",
            "Events behind their partition's watermark: dead-lettered or kept without samples",
            registry=r,
        )
        self.late_labels = Counter(
            f"{PREFIX}_late_labels_total",
            "Late clicks in an impression's window after it closed as a negative (join labelling)",
            registry=r,
        )
        self.timestamp_mismatches = Counter(
            f"{PREFIX}_timestamp_mismatches_total",
            "Records whose timestamp is not their event time (alignment reads timestamps)",
            registry=r,
        )
        self.negatives_short = Counter(
            f"{PREFIX}_negatives_short_total",
            "Negatives the sampler could not draw: too few fitting items in its pools (cold start)",
            registry=r,
        )
        self.negatives_fallback = Counter(
            f"{PREFIX}_negatives_fallback_total",
            "Negatives meant from the user's history or categories, drawn from the global pools",
            registry=r,
        )
        self.dead_letters = Counter(
            f"{PREFIX}_dead_letters_total", "Event records dead-lettered, by kind of reason",
            ["reason"], registry=r,
        )
        for kind in KINDS:
            self.dead_letters.labels(kind)
        self.batch_seconds = Histogram(
            f"{PREFIX}_batch_seconds", "Seconds from reading a batch to its commit, retries included",
            buckets=BATCH_SECONDS_BUCKETS, registry=r,
        )
        self.newest_event = Gauge(
            f"{PREFIX}_newest_event_timestamp_seconds",
            "Event time of the newest sample emitted, epoch seconds", registry=r,
        )
        self.newest_event.set(math.nan)  # "none yet", not 1970
        self.event_to_sample = AgeHistogram(
            f"{PREFIX}_event_to_sample_seconds",
            "Seconds from each sample's event time to its batch's commit (the sample readable)", r,
        )
        self.partitions = Gauge(
            f"{PREFIX}_assigned_partitions", "Partitions assigned to this consumer", registry=r
        )

    def observe_batch(self, report: BatchReport) -> None:
        """Count one committed batch."""
        result = report.result
        self.batches.inc()
        self.events.inc(result.events)
        self.samples.inc(len(result.samples))
        self.duplicates.inc(result.duplicates)
        self.late.inc(result.late)
        self.late_labels.inc(result.late_labels)
        self.timestamp_mismatches.inc(result.timestamp_mismatches)
        self.negatives_short.inc(result.negatives_short)
        self.negatives_fallback.inc(result.negatives_fallback)
        for letter in result.dead:
            self.dead_letters.labels(reason_kind(letter.reason)).inc()
        self.batch_seconds.observe(report.seconds)
        self.event_to_sample.observe_many(ages_s(self._clock(), [s.ts for s in result.samples]))
        if report.newest_event_ms is not None:
            self.newest_event.set(report.newest_event_ms / 1000.0)
        self.partitions.set(len(report.partitions))

    def track_partitions(self, held: Callable[[], int]) -> None:
        """Read ``_assigned_partitions`` from ``held`` at each scrape, in place of the last batch's.

        A consumer holds partitions while idle, and loses them at a rebalance, between batches.
        """
        self.partitions.set_function(lambda: float(held()))
