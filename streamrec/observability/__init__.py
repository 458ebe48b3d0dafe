"""Prometheus metrics of the long-running commands, all in this package.

Names start with ``streamrec_``, times are in seconds and sizes in bytes, counters end in
``_total`` and histograms have explicit buckets. Each metrics object owns its own
``CollectorRegistry`` (never the global one), so tests and the in-process demo can run
several; ``serve`` puts one on ``/metrics`` and never fails the job it watches.
"""

from __future__ import annotations

from streamrec.observability.consumer import ConsumerMetrics, reason_kind
from streamrec.observability.lag import LagCollector, LagProbe, lag_client, partition_lag
from streamrec.observability.learner import LearnerMetrics, calibration_ratio
from streamrec.observability.server import DEFAULT_HOST, MetricsServer, serve

__all__ = [
    "DEFAULT_HOST",
    "ConsumerMetrics",
    "LagCollector",
    "LagProbe",
    "LearnerMetrics",
    "MetricsServer",
    "calibration_ratio",
    "lag_client",
    "partition_lag",
    "reason_kind",
    "serve",
]
