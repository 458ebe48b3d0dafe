"""Freshness: ages observed in bulk, per stage, and a served version's ages, as Prometheus reads them."""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from streamrec.observability import ConsumerMetrics, LearnerMetrics
from streamrec.observability.freshness import (
    AgeHistogram,
    LoadedVersion,
    ServedFreshness,
    ages_s,
    loaded_version,
)
from streamrec.snapshots.manifest import SnapshotManifest
from streamrec.snapshots.store import SnapshotStore
from tests.unit.test_observability import T0_MS, batch_report, families, report, value


def test_age_histogram_counts_each_value_in_its_inclusive_bucket() -> None:
    registry = CollectorRegistry()
    hist = AgeHistogram("x_seconds", "doc", registry, buckets=(1.0, 5.0))
    hist.observe_many(np.array([0.5, 1.0, 1.5, 5.0, 9.0]))
    hist.observe_many(np.array([]))
    assert value(registry, "x_seconds_bucket", le="1.0") == 2  # le is inclusive
    assert value(registry, "x_seconds_bucket", le="5.0") == 4
    assert value(registry, "x_seconds_bucket", le="+Inf") == 5
    assert value(registry, "x_seconds_count") == 5 == hist.count
    assert value(registry, "x_seconds_sum") == pytest.approx(17.0) == hist.total
    assert families(registry) == {"x_seconds": "histogram"}


def test_age_histogram_refuses_nan() -> None:
    hist = AgeHistogram("x_seconds", "doc", CollectorRegistry())
    with pytest.raises(ValueError, match="x_seconds: NaN"):
        hist.observe_many(np.array([1.0, math.nan]))
    assert hist.count == 0


def test_ages_are_seconds_since_the_event_and_never_negative() -> None:
    ages = ages_s(T0_MS / 1000 + 2.0, [T0_MS, T0_MS + 500, T0_MS + 3000])
    assert ages.tolist() == pytest.approx([2.0, 1.5, 0.0])  # a future event (skewed clock): 0


def test_the_learner_observes_every_trained_sample_at_the_end_of_training() -> None:
    metrics = LearnerMetrics(clock=lambda: T0_MS / 1000 + 10.0)
    ts = np.array([T0_MS - 20_000, T0_MS - 5_000, T0_MS], dtype=np.int64)
    metrics.observe_report(report(last_ts=T0_MS, event_ts=ts))
    r = metrics.registry
    assert value(r, "streamrec_learner_event_to_trained_seconds_count") == 3
    assert value(r, "streamrec_learner_event_to_trained_seconds_sum") == pytest.approx(30 + 15 + 10)
    assert value(r, "streamrec_learner_event_to_trained_seconds_bucket", le="10.0") == 1
    assert value(r, "streamrec_learner_event_to_trained_seconds_bucket", le="15.0") == 2


def test_the_consumer_observes_every_sample_at_its_batch_commit() -> None:
    metrics = ConsumerMetrics(clock=lambda: T0_MS / 1000 + 0.2)
    metrics.observe_batch(batch_report(samples=4))  # every sample's event at T0
    r = metrics.registry
    assert value(r, "streamrec_consumer_event_to_sample_seconds_count") == 4
    assert value(r, "streamrec_consumer_event_to_sample_seconds_sum") == pytest.approx(0.8)
    assert value(r, "streamrec_consumer_event_to_sample_seconds_bucket", le="0.25") == 4


def test_a_loaded_version_feeds_served_freshness() -> None:
    now = [T0_MS / 1000 + 100.0]
    registry = CollectorRegistry()
    served = ServedFreshness(registry, clock=lambda: now[0])
    assert math.isnan(value(registry, "streamrec_serving_model_event_age_seconds"))
    served.observe_load(LoadedVersion(3, now[0], created_at_s=T0_MS / 1000 + 70.0, newest_event_ms=T0_MS))
    assert value(registry, "streamrec_serving_trained_to_servable_seconds_sum") == pytest.approx(30.0)
    assert value(registry, "streamrec_serving_event_to_servable_seconds_sum") == pytest.approx(100.0)
    now[0] += 20.0  # the served model ages until the next version loads
    assert value(registry, "streamrec_serving_model_event_age_seconds") == pytest.approx(120.0)


def test_the_version_a_server_starts_on_sets_the_age_and_times_no_load() -> None:
    # servable before this server started, for as long as it is old: a restart is no promotion
    now = [T0_MS / 1000 + 1_400.0]
    registry = CollectorRegistry()
    served = ServedFreshness(registry, clock=lambda: now[0])
    served.take_up(LoadedVersion(3, now[0], created_at_s=T0_MS / 1000 + 10.0, newest_event_ms=T0_MS))
    assert value(registry, "streamrec_serving_trained_to_servable_seconds_count") == 0
    assert value(registry, "streamrec_serving_event_to_servable_seconds_count") == 0
    assert value(registry, "streamrec_serving_model_event_age_seconds") == pytest.approx(1_400.0)


def test_a_version_without_times_observes_nothing_and_its_age_is_unknown() -> None:
    registry = CollectorRegistry()
    served = ServedFreshness(registry)
    served.observe_load(LoadedVersion(3, T0_MS / 1000, created_at_s=T0_MS / 1000 - 5, newest_event_ms=T0_MS))
    served.observe_load(LoadedVersion(4, T0_MS / 1000, created_at_s=None, newest_event_ms=None))
    assert value(registry, "streamrec_serving_trained_to_servable_seconds_count") == 1
    assert value(registry, "streamrec_serving_event_to_servable_seconds_count") == 1
    assert math.isnan(value(registry, "streamrec_serving_model_event_age_seconds"))


def test_loaded_version_reads_the_manifest_times(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    written = store.write(
        {"dense": {"w": np.zeros(2, np.float32)}},
        micro_batches=1,
        samples_trained=3,
        positions=(),
        newest_event_ms=T0_MS,
    )
    loaded = loaded_version(store, written.version, now_s=T0_MS / 1000 + 9.0)
    created = datetime.fromisoformat(written.created_at).timestamp()
    assert loaded == LoadedVersion(written.version, T0_MS / 1000 + 9.0, created, T0_MS)
    missing = loaded_version(store, 99, now_s=1.0)  # unreadable: times unknown, no failure
    assert missing == LoadedVersion(99, 1.0, None, None)


def test_a_manifest_written_before_the_field_still_loads() -> None:
    old = (
        b'{"version": 2, "created_at": "2026-01-01T00:00:00.000+00:00", "micro_batches": 1,'
        b' "samples_trained": 5, "positions": []}'
    )
    assert SnapshotManifest.from_json(old).newest_event_ms is None
