"""Freshness along the pipeline: how long an event takes to become a sample, trained, servable.

Each stage compares its wall clock with the event time a sample carries (``ts``, epoch ms):

- the consumer, when a batch's samples are committed: event → sample;
- the learner, when a micro-batch is trained: event → trained;
- ``serve``, when it loads a version: snapshot → servable (load time minus the snapshot's
  ``created_at``) and event → servable of the newest event the version was trained on
  (``newest_event_ms`` in its manifest); a gauge follows the served version's newest event's
  age.

The figures are differences of clocks on different hosts where the stages run apart: they
assume synchronized clocks (NTP keeps them within milliseconds, well under these buckets).

A micro-batch holds up to 10^5 samples, so ages are observed in bulk (`AgeHistogram`), with
numpy, not one ``Histogram.observe`` call per sample.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import numpy as np
from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from streamrec.errors import SnapshotError

if TYPE_CHECKING:  # the store imports safetensors: only for the type checker
    from streamrec.snapshots.store import SnapshotStore

# From under a second (a consumer's batch) to past the default interval (180 s) plus a
# snapshot, an export and a reload, and on to an hour for a learner far behind.
AGE_SECONDS_BUCKETS = (
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    15.0,
    30.0,
    60.0,
    120.0,
    180.0,
    210.0,
    240.0,
    300.0,
    600.0,
    1200.0,
    3600.0,
)


class AgeHistogram(Collector):
    """A Prometheus histogram observed many values at a time (`observe_many`).

    Bucket bounds are inclusive upper bounds, as Prometheus's ``le``; ``+Inf`` is added.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        registry: CollectorRegistry,
        buckets: Sequence[float] = AGE_SECONDS_BUCKETS,
    ) -> None:
        """Register an empty histogram ``name`` in ``registry``."""
        self.name = name
        self._doc = documentation
        self._bounds = np.asarray(buckets, dtype=np.float64)
        self._counts = np.zeros(len(buckets) + 1, dtype=np.int64)  # per bucket, the last +Inf
        self._sum = 0.0
        self._lock = threading.Lock()  # a scrape reads buckets and sum of the same observations
        registry.register(self)

    def observe_many(self, values: np.ndarray) -> None:
        """Count every value of ``values`` (seconds) in its bucket; NaNs are refused."""
        values = np.asarray(values, dtype=np.float64)
        if np.isnan(values).any():
            raise ValueError(f"{self.name}: NaN among the ages observed")
        index = np.searchsorted(self._bounds, values, side="left")  # v <= bound[i]
        counts = np.bincount(index, minlength=len(self._counts))
        with self._lock:
            self._counts += counts
            self._sum += float(values.sum())

    @property
    def count(self) -> int:
        """Values observed so far."""
        return int(self._counts.sum())

    @property
    def total(self) -> float:
        """The sum of the values observed so far."""
        return self._sum

    def describe(self) -> Iterable[Metric]:
        """The metric's name and kind, without values."""
        return [HistogramMetricFamily(self.name, self._doc)]

    def collect(self) -> Iterator[Metric]:
        """The cumulative buckets, count and sum."""
        with self._lock:
            cumulative, total = np.cumsum(self._counts), self._sum
        bounds = [*(floatToGoString(b) for b in self._bounds), "+Inf"]
        family = HistogramMetricFamily(
            self.name,
            self._doc,
            buckets=list(zip(bounds, cumulative.tolist(), strict=True)),
            sum_value=total,
        )
        yield family


def ages_s(now_s: float, event_ms: np.ndarray | Sequence[int]) -> np.ndarray:
    """Seconds from each event time (epoch ms) to ``now_s``, never negative.

    An event time a little in the future (clock skew between hosts) reads 0, not a negative age.
    """
    return np.maximum(now_s - np.asarray(event_ms, dtype=np.float64) / 1000.0, 0.0)


@dataclass(frozen=True)
class LoadedVersion:
    """A version as `serve` loaded it: when, when it was written, its newest event trained."""

    version: int
    loaded_at_s: float  # epoch seconds
    created_at_s: float | None  # the snapshot's created_at, None when its manifest is unreadable
    newest_event_ms: int | None  # None for a snapshot written before the field existed


def loaded_version(store: SnapshotStore, version: int, now_s: float | None = None) -> LoadedVersion:
    """``version`` of ``store`` loaded at ``now_s`` (now by default), with its manifest's times.

    A manifest that cannot be read leaves both times unknown: freshness never fails a load.
    """
    loaded_at = time.time() if now_s is None else now_s
    try:
        manifest = store.manifest(version)
    except SnapshotError:
        return LoadedVersion(version, loaded_at, None, None)
    created = datetime.fromisoformat(manifest.created_at).timestamp()
    return LoadedVersion(version, loaded_at, created, manifest.newest_event_ms)


class ServedFreshness:
    """`serve`'s freshness metrics, in the service's registry."""

    def __init__(self, registry: CollectorRegistry, clock: Callable[[], float] = time.time) -> None:
        """Create the metrics; the age gauge reads NaN until a version with an event time loads."""
        self._clock = clock
        self._newest_event_s = math.nan
        self.trained_to_servable = Histogram(
            "streamrec_serving_trained_to_servable_seconds",
            "Seconds from a snapshot's writing to serve loading it (export and promotion included)",
            buckets=AGE_SECONDS_BUCKETS,
            registry=registry,
        )
        self.event_to_servable = Histogram(
            "streamrec_serving_event_to_servable_seconds",
            "Seconds from the newest event a loaded version was trained on to serve loading it",
            buckets=AGE_SECONDS_BUCKETS,
            registry=registry,
        )
        age = Gauge(
            "streamrec_serving_model_event_age_seconds",
            "Now minus the newest event time the served version was trained on",
            registry=registry,
        )
        age.set_function(self.model_event_age_s)

    def observe_load(self, loaded: LoadedVersion) -> None:
        """Observe a version just loaded in place of another (a promotion, a rollback)."""
        self.take_up(loaded)
        if loaded.created_at_s is not None:
            self.trained_to_servable.observe(max(loaded.loaded_at_s - loaded.created_at_s, 0.0))
        if loaded.newest_event_ms is not None:
            self.event_to_servable.observe(max(loaded.loaded_at_s - self._newest_event_s, 0.0))

    def take_up(self, loaded: LoadedVersion) -> None:
        """The version the server starts on: its age, and no load timed.

        It was servable before this server started, for as long as it is old: timing its load
        put one reading as old as the version (~1,400 s) beside the promotions' (5-10 s) at
        every restart of ``serve``.
        """
        self._newest_event_s = math.nan if loaded.newest_event_ms is None else loaded.newest_event_ms / 1000.0

    def model_event_age_s(self) -> float:
        """Now minus the served version's newest event time; NaN when unknown."""
        return self._clock() - self._newest_event_s
