"""The metrics, fed fake reports, as Prometheus reads them; lag over fake clients; status lines."""

from __future__ import annotations

import dataclasses
import math
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from streamrec.cli.common import format_duration
from streamrec.cli.consumers import ConsumerStatus
from streamrec.cli.learner import LearnerStatus, snapshot_bytes
from streamrec.consumers.native_runner import BatchReport
from streamrec.consumers.negatives import NoveltyMatchedSampler
from streamrec.consumers.processor import BatchResult
from streamrec.deadletters import OTHER_REASON, REASONS, DeadLetter
from streamrec.errors import InvalidEvent
from streamrec.events import parse_event
from streamrec.kafka.records import Partition, Position
from streamrec.learner.metrics import MicroBatchMetrics
from streamrec.learner.runner import MicroBatchReport
from streamrec.observability import (
    ConsumerMetrics,
    LagCollector,
    LagProbe,
    LearnerMetrics,
    calibration_ratio,
    partition_lag,
    reason_kind,
)
from streamrec.observability.consumer import BATCH_SECONDS_BUCKETS
from streamrec.observability.learner import TRAIN_SECONDS_BUCKETS
from streamrec.snapshots.store import SnapshotManifest

T0_MS = 1_700_000_000_000  # an event time, epoch ms


def scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the registry's exposition text: (name, sorted labels) -> value."""
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return scrape(registry)[(name, tuple(sorted(labels.items())))]


def label_values(registry: CollectorRegistry, name: str) -> set[str]:
    """The values of the one label of ``name``'s samples."""
    return {labels[0][1] for sample, labels in scrape(registry) if sample == name}


def families(registry: CollectorRegistry) -> dict[str, str]:
    """Family name -> type, as exposed."""
    text = generate_latest(registry).decode()
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def batch_metrics(**overrides: Any) -> MicroBatchMetrics:
    fields: dict[str, Any] = dict(
        samples=1000, positives=250, auc=0.75, gauc=0.7, logloss=0.5, known_auc=0.8,
        known_samples=600, novelty_auc=0.52, tell_history_auc=0.55, tell_category_auc=0.6,
        mean_prediction=0.3, positive_rate=0.25,
    )
    return MicroBatchMetrics(**{**fields, **overrides})


def report(index: int = 1, last_ts: int = T0_MS, **overrides: Any) -> MicroBatchReport:
    fields: dict[str, Any] = dict(
        index=index, metrics=batch_metrics(), first_ts=last_ts - 60_000, last_ts=last_ts, loss=0.48,
        score_seconds=0.2, train_seconds=1.5, dead=2, steps=4, skipped_steps=1,
    )
    return MicroBatchReport(**{**fields, **overrides})


def manifest(created: datetime, version: int = 3) -> SnapshotManifest:
    return SnapshotManifest(
        version=version, created_at=created.isoformat(timespec="milliseconds"),
        micro_batches=5, samples_trained=5000, positions=(),
    )


# --- learner ---------------------------------------------------------------------------------

LEARNER_FAMILIES = {
    "streamrec_learner_micro_batches": "counter",
    "streamrec_learner_samples_trained": "counter",
    "streamrec_learner_dead_letters": "counter",
    "streamrec_learner_steps": "counter",
    "streamrec_learner_skipped_steps": "counter",
    "streamrec_learner_snapshots": "counter",
    "streamrec_learner_ids_admitted": "counter",
    "streamrec_learner_ids_evicted": "counter",
    "streamrec_learner_ids_refused": "counter",
    "streamrec_learner_train_seconds": "histogram",
    "streamrec_learner_score_seconds": "histogram",
    "streamrec_learner_progressive_auc": "gauge",
    "streamrec_learner_progressive_gauc": "gauge",
    "streamrec_learner_progressive_logloss": "gauge",
    "streamrec_learner_progressive_known_auc": "gauge",
    "streamrec_learner_progressive_novelty_auc": "gauge",
    "streamrec_learner_progressive_tell_history_auc": "gauge",
    "streamrec_learner_progressive_tell_category_auc": "gauge",
    "streamrec_learner_mean_prediction": "gauge",
    "streamrec_learner_positive_rate": "gauge",
    "streamrec_learner_calibration_ratio": "gauge",
    "streamrec_learner_loss": "gauge",
    "streamrec_learner_ewc_penalty_share": "gauge",
    "streamrec_learner_embedding_rows_in_use": "gauge",
    "streamrec_learner_newest_event_timestamp_seconds": "gauge",
    "streamrec_learner_freshness_seconds": "gauge",
    "streamrec_learner_snapshot_lag_seconds": "gauge",
    "streamrec_learner_snapshot_timestamp_seconds": "gauge",
    "streamrec_learner_snapshot_version": "gauge",
    "streamrec_learner_snapshot_bytes": "gauge",
    "streamrec_learner_event_to_trained_seconds": "histogram",
}


def test_learner_metrics_are_all_named_and_typed() -> None:
    exposed = families(LearnerMetrics().registry)
    created = {name for name in exposed if name.endswith("_created")}  # prometheus-client's own
    assert {k: v for k, v in exposed.items() if k not in created} == LEARNER_FAMILIES


def test_counters_are_exposed_with_total() -> None:
    text = generate_latest(LearnerMetrics().registry).decode()
    for name, kind in LEARNER_FAMILIES.items():
        if kind == "counter":
            assert f"# TYPE {name}_total counter" in text


def test_quality_gauges_read_nan_before_the_first_report() -> None:
    metrics = LearnerMetrics(clock=lambda: 0.0)
    for name in ("progressive_auc", "progressive_gauc", "freshness_seconds", "snapshot_lag_seconds"):
        assert math.isnan(value(metrics.registry, f"streamrec_learner_{name}"))


def test_reports_feed_counters_gauges_and_histograms() -> None:
    metrics = LearnerMetrics()
    metrics.observe_report(report(1))
    metrics.observe_report(report(2, metrics=batch_metrics(samples=500, auc=0.81, gauc=0.77)))
    r = metrics.registry
    assert value(r, "streamrec_learner_micro_batches_total") == 2
    assert value(r, "streamrec_learner_samples_trained_total") == 1500
    assert value(r, "streamrec_learner_dead_letters_total") == 4
    assert value(r, "streamrec_learner_steps_total") == 8
    assert value(r, "streamrec_learner_skipped_steps_total") == 2
    assert value(r, "streamrec_learner_progressive_auc") == 0.81  # the last micro-batch
    assert value(r, "streamrec_learner_progressive_gauc") == 0.77
    assert value(r, "streamrec_learner_progressive_logloss") == 0.5
    assert value(r, "streamrec_learner_progressive_known_auc") == 0.8
    assert value(r, "streamrec_learner_progressive_novelty_auc") == 0.52
    assert value(r, "streamrec_learner_progressive_tell_history_auc") == 0.55
    assert value(r, "streamrec_learner_progressive_tell_category_auc") == 0.6
    assert value(r, "streamrec_learner_mean_prediction") == 0.3
    assert value(r, "streamrec_learner_positive_rate") == 0.25
    assert value(r, "streamrec_learner_calibration_ratio") == pytest.approx(1.2)
    assert value(r, "streamrec_learner_loss") == 0.48


def test_train_seconds_are_seconds_in_explicit_buckets() -> None:
    metrics = LearnerMetrics()
    metrics.observe_report(report(train_seconds=1.5, score_seconds=0.02))
    r = metrics.registry
    buckets = label_values(r, "streamrec_learner_train_seconds_bucket")
    assert buckets == {*(str(float(b)) for b in TRAIN_SECONDS_BUCKETS), "+Inf"}
    # 1.5 s lands between 1 and 2.5: milliseconds fed in would land in +Inf only.
    assert value(r, "streamrec_learner_train_seconds_bucket", le="1.0") == 0
    assert value(r, "streamrec_learner_train_seconds_bucket", le="2.5") == 1
    assert value(r, "streamrec_learner_train_seconds_sum") == 1.5
    assert value(r, "streamrec_learner_score_seconds_bucket", le="0.025") == 1


def test_freshness_is_now_minus_the_newest_event_trained() -> None:
    now = [T0_MS / 1000 + 10.0]
    metrics = LearnerMetrics(clock=lambda: now[0])
    metrics.observe_report(report(1, last_ts=T0_MS))
    metrics.observe_report(report(2, last_ts=T0_MS - 5_000))  # older events: newest stays
    r = metrics.registry
    assert value(r, "streamrec_learner_newest_event_timestamp_seconds") == T0_MS / 1000
    assert value(r, "streamrec_learner_freshness_seconds") == pytest.approx(10.0)
    now[0] += 30.0  # measured at scrape time: it grows while nothing is trained
    assert value(r, "streamrec_learner_freshness_seconds") == pytest.approx(40.0)
    assert metrics.freshness_seconds() == pytest.approx(40.0)


def test_snapshot_lag_is_snapshot_time_minus_the_newest_event_in_it() -> None:
    metrics = LearnerMetrics()
    created = datetime.fromtimestamp(T0_MS / 1000 + 95.5, UTC)
    metrics.observe_report(report(last_ts=T0_MS))
    metrics.observe_snapshot(manifest(created, version=3), size_bytes=123_456)
    r = metrics.registry
    assert value(r, "streamrec_learner_snapshot_lag_seconds") == pytest.approx(95.5)
    assert value(r, "streamrec_learner_snapshot_timestamp_seconds") == pytest.approx(created.timestamp())
    assert value(r, "streamrec_learner_snapshot_version") == 3
    assert value(r, "streamrec_learner_snapshot_bytes") == 123_456
    assert value(r, "streamrec_learner_snapshots_total") == 1


def test_a_snapshot_before_any_training_leaves_its_lag_unknown() -> None:
    metrics = LearnerMetrics()
    metrics.observe_snapshot(manifest(datetime.now(UTC)))
    assert math.isnan(value(metrics.registry, "streamrec_learner_snapshot_lag_seconds"))
    assert math.isnan(value(metrics.registry, "streamrec_learner_snapshot_bytes"))


def test_a_resumed_snapshot_sets_the_freshness_and_snapshot_gauges() -> None:
    # Found by a tour of docs/operating/metrics.md: a learner restarted on snapshot v2 reported
    # freshness, newest event and snapshot time NaN until its first micro-batch and snapshot, so
    # the page's "model is going stale" and "snapshots stop" alerts could not fire for a learner
    # that restarted and then trained nothing.
    metrics = LearnerMetrics(clock=lambda: T0_MS / 1000 + 600)
    created = datetime.fromtimestamp(T0_MS / 1000 + 95.5, UTC)
    resumed = dataclasses.replace(manifest(created, version=2), newest_event_ms=T0_MS)
    metrics.observe_resumed(resumed, size_bytes=4_096)
    r = metrics.registry
    assert value(r, "streamrec_learner_snapshot_version") == 2
    assert value(r, "streamrec_learner_snapshot_timestamp_seconds") == pytest.approx(created.timestamp())
    assert value(r, "streamrec_learner_snapshot_lag_seconds") == pytest.approx(95.5)
    assert value(r, "streamrec_learner_snapshot_bytes") == 4_096
    assert value(r, "streamrec_learner_newest_event_timestamp_seconds") == T0_MS / 1000
    assert value(r, "streamrec_learner_freshness_seconds") == pytest.approx(600)
    assert value(r, "streamrec_learner_snapshots_total") == 0  # this process wrote none
    metrics.observe_report(report(last_ts=T0_MS - 1_000))  # older than the snapshot's: kept
    assert value(r, "streamrec_learner_newest_event_timestamp_seconds") == T0_MS / 1000


def test_a_snapshot_resumed_without_an_event_time_leaves_freshness_unknown() -> None:
    metrics = LearnerMetrics()
    metrics.observe_resumed(manifest(datetime.now(UTC)))
    assert math.isnan(value(metrics.registry, "streamrec_learner_freshness_seconds"))
    assert math.isnan(value(metrics.registry, "streamrec_learner_snapshot_lag_seconds"))


def test_hashed_tables_and_no_ewc_report_no_id_figures() -> None:
    metrics = LearnerMetrics()
    metrics.observe_report(report())
    samples = scrape(metrics.registry)
    assert samples[("streamrec_learner_ewc_penalty_share", ())] == 0.0  # EWC off
    per_table = ("streamrec_learner_ids_", "streamrec_learner_embedding")
    assert not [k for k in samples if k[0].startswith(per_table)]


def test_ewc_and_dynamic_tables_feed_their_metrics() -> None:
    metrics = LearnerMetrics()
    tables: dict[str, Any] = dict(
        ids_admitted={"item": 40, "category": 3}, ids_evicted={"item": 7}, ids_refused={"item": 2},
        embedding_rows={"item": 900, "category": 40},
    )
    metrics.observe_report(report(**tables))
    metrics.observe_report(report(2, penalty_share=0.25, **tables))
    r = metrics.registry
    assert value(r, "streamrec_learner_ewc_penalty_share") == 0.25
    assert value(r, "streamrec_learner_ids_admitted_total", table="item") == 80  # counted per batch
    assert value(r, "streamrec_learner_ids_admitted_total", table="category") == 6
    assert value(r, "streamrec_learner_ids_evicted_total", table="item") == 14
    assert value(r, "streamrec_learner_ids_refused_total", table="item") == 4
    assert value(r, "streamrec_learner_embedding_rows_in_use", table="item") == 900  # a level
    assert value(r, "streamrec_learner_embedding_rows_in_use", table="category") == 40


def test_calibration_ratio() -> None:
    assert calibration_ratio(0.3, 0.25) == pytest.approx(1.2)
    assert math.isnan(calibration_ratio(0.3, 0.0))  # no positives: no ratio
    assert math.isnan(calibration_ratio(0.3, math.nan))


# --- consumers -------------------------------------------------------------------------------

def invalid_event_reason(raw: bytes | None) -> str:
    """The reason the consumers give a bad record, from the real parser."""
    try:
        parse_event(raw, now_ms=T0_MS, max_future_ms=300_000, max_bytes=200)
    except InvalidEvent as exc:
        return str(exc)
    raise AssertionError(f"{raw!r} parsed")


GOOD = b'"event_id":"e1","user_id":"u1","item_id":"i1","category_id":"c1","action":"pv"'


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        (None, "null_value"),
        (b"x" * 300, "too_large"),
        (b"{nope", "not_json"),
        (b"[1, 2]", "not_object"),
        (b'{"event_id": "e1"}', "missing_field"),
        (b"{" + GOOD + b',"ts":' + str(T0_MS + 10**9).encode() + b"}", "future_timestamp"),
        (b"{" + GOOD + b',"ts":1700000000}', "bad_timestamp"),
        (b"{" + GOOD + b',"ts":"soon"}', "bad_timestamp"),
        (b"{" + GOOD + b',"ts":' + str(T0_MS).encode() + b',"label":2}', "bad_label"),
        (b'{"event_id":"","user_id":"u1","item_id":"i1","category_id":"c1","action":"pv","ts":1}', "bad_id"),
    ],
)
def test_dead_letter_reasons_fold_into_few_kinds(raw: bytes | None, kind: str) -> None:
    assert reason_kind(invalid_event_reason(raw)) == kind


def test_other_dead_letter_reasons() -> None:
    assert reason_kind("event id 'e1' reused with other content (first at 0:12)") == "conflicting_event_id"
    assert reason_kind("something new") == OTHER_REASON


def letter(reason: str) -> DeadLetter:
    return DeadLetter(reason=reason, position=Position("events", 0, 1), value=b"x")


def batch_report(events: int = 100, samples: int = 150, dead: tuple[str, ...] = (), **kw: Any) -> BatchReport:
    from streamrec.samples import Sample

    sample = Sample("s", "u", T0_MS, "i", "c", 1, (), ())
    result = BatchResult(
        events=events, sampler=NoveltyMatchedSampler(1, 1, 1), samples=[sample] * samples,
        values=[sample.to_json()] * samples,
        dead=[letter(r) for r in dead], duplicates=kw.pop("duplicates", 0),
        negatives_short=kw.pop("negatives_short", 0), negatives_fallback=kw.pop("negatives_fallback", 0),
    )
    fields: dict[str, Any] = dict(seconds=0.08, newest_event_ms=T0_MS, partitions=[Partition("events", 0)])
    return BatchReport(result, **{**fields, **kw})


def test_consumer_metrics_count_batches() -> None:
    metrics = ConsumerMetrics()
    metrics.observe_batch(batch_report(dead=("not valid JSON: x", "not valid JSON: y", "huh"), duplicates=2,
                                       negatives_short=3, negatives_fallback=5))
    metrics.observe_batch(batch_report(events=50, samples=70, seconds=2.0, newest_event_ms=T0_MS + 1000,
                                       partitions=[Partition("events", 0), Partition("events", 1)]))
    r = metrics.registry
    assert value(r, "streamrec_consumer_batches_total") == 2
    assert value(r, "streamrec_consumer_events_total") == 150
    assert value(r, "streamrec_consumer_samples_total") == 220
    assert value(r, "streamrec_consumer_duplicates_total") == 2
    assert value(r, "streamrec_consumer_negatives_short_total") == 3
    assert value(r, "streamrec_consumer_negatives_fallback_total") == 5
    assert value(r, "streamrec_consumer_dead_letters_total", reason="not_json") == 2
    assert value(r, "streamrec_consumer_dead_letters_total", reason="other") == 1
    assert value(r, "streamrec_consumer_dead_letters_total", reason="too_large") == 0  # present at 0
    assert value(r, "streamrec_consumer_batch_seconds_bucket", le="0.1") == 1
    assert value(r, "streamrec_consumer_batch_seconds_bucket", le="2.5") == 2
    assert value(r, "streamrec_consumer_batch_seconds_sum") == pytest.approx(2.08)
    assert value(r, "streamrec_consumer_newest_event_timestamp_seconds") == T0_MS / 1000 + 1
    assert value(r, "streamrec_consumer_assigned_partitions") == 2


def test_consumer_metrics_are_all_named_and_typed() -> None:
    metrics = ConsumerMetrics()
    exposed = {k: v for k, v in families(metrics.registry).items() if not k.endswith("_created")}
    assert exposed == {
        "streamrec_consumer_batches": "counter",
        "streamrec_consumer_events": "counter",
        "streamrec_consumer_samples": "counter",
        "streamrec_consumer_duplicates": "counter",
        "streamrec_consumer_late_events": "counter",
        "streamrec_consumer_late_labels": "counter",
        "streamrec_consumer_timestamp_mismatches": "counter",
        "streamrec_consumer_negatives_short": "counter",
        "streamrec_consumer_negatives_fallback": "counter",
        "streamrec_consumer_dead_letters": "counter",
        "streamrec_consumer_batch_seconds": "histogram",
        "streamrec_consumer_newest_event_timestamp_seconds": "gauge",
        "streamrec_consumer_assigned_partitions": "gauge",
        "streamrec_consumer_event_to_sample_seconds": "histogram",
    }
    kinds = label_values(metrics.registry, "streamrec_consumer_dead_letters_total")
    assert kinds == {kind for _, kind in REASONS} | {OTHER_REASON}
    buckets = label_values(metrics.registry, "streamrec_consumer_batch_seconds_bucket")
    assert buckets == {*(str(float(b)) for b in BATCH_SECONDS_BUCKETS), "+Inf"}


# --- lag -------------------------------------------------------------------------------------

class FakeLagClient:
    """Watermarks, committed offsets and metadata from dicts; records the timeouts asked."""

    def __init__(
        self, topic: str, watermarks: dict[int, tuple[int, int]], committed: dict[int, int] | None = None,
        fail: bool = False,
    ) -> None:
        self.topic = topic
        self.watermarks = watermarks
        self.committed_offsets = committed or {}
        self.fail = fail
        self.calls: list[str] = []
        self.timeouts: list[float] = []
        self.closed = False

    def _call(self, name: str, timeout: float) -> None:
        self.calls.append(name)
        self.timeouts.append(timeout)
        if self.fail:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        self._call("list_topics", timeout)
        partitions = dict.fromkeys(self.watermarks)
        return SimpleNamespace(topics={self.topic: SimpleNamespace(partitions=partitions)})

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        self._call("get_watermark_offsets", timeout)
        return self.watermarks[partition.partition]

    def committed(self, partitions: list[TopicPartition], timeout: float = -1) -> list[TopicPartition]:
        self._call("committed", timeout)
        return [
            TopicPartition(tp.topic, tp.partition, self.committed_offsets.get(tp.partition, -1001))
            for tp in partitions
        ]

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize(
    ("position", "low", "high", "lag"),
    [(40, 0, 100, 60), (None, 10, 100, 90), (5, 10, 100, 90), (100, 0, 100, 0), (120, 0, 100, 0)],
)
def test_partition_lag(position: int | None, low: int, high: int, lag: int) -> None:
    assert partition_lag(position, low, high) == lag


def test_lag_uses_own_positions_then_committed_offsets_then_the_start() -> None:
    client = FakeLagClient("samples", {0: (0, 100), 1: (10, 50), 2: (20, 30)}, committed={1: 45})
    probe = LagProbe(client, "samples", lambda: {Partition("samples", 0): 70, Partition("other", 1): 0})
    assert probe.measure() == {0: 30, 1: 5, 2: 10}
    probe.close()
    assert client.closed


def test_lag_asks_no_committed_offsets_it_does_not_need() -> None:
    client = FakeLagClient("samples", {0: (0, 100)})
    assert LagProbe(client, "samples", lambda: {Partition("samples", 0): 100}).measure() == {0: 0}
    assert "committed" not in client.calls


def test_lag_queries_share_one_time_budget() -> None:
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0  # each look at the clock: one second later
        return now[0]

    client = FakeLagClient("events", {p: (0, 10) for p in range(4)})
    with pytest.raises(TimeoutError):
        LagProbe(client, "events", budget_s=4.5, clock=clock).measure()
    assert client.timeouts == sorted(client.timeouts, reverse=True)
    assert all(0 < t <= 4.5 for t in client.timeouts)


def test_lag_collector_reports_per_partition_and_success() -> None:
    registry = CollectorRegistry()
    client = FakeLagClient("events", {0: (0, 100), 1: (0, 7)}, committed={0: 90})
    registry.register(LagCollector(LagProbe(client, "events"), "streamrec_consumer"))
    r = registry
    assert value(r, "streamrec_consumer_lag_records", topic="events", partition="0") == 10
    assert value(r, "streamrec_consumer_lag_records", topic="events", partition="1") == 7
    assert value(r, "streamrec_consumer_lag_query_success") == 1


def test_a_failed_lag_query_is_a_zero_success_and_no_lag() -> None:
    registry = CollectorRegistry()
    client = FakeLagClient("events", {0: (0, 100)}, fail=True)
    registry.register(LagCollector(LagProbe(client, "events"), "streamrec_consumer"))
    client.calls.clear()
    samples = scrape(registry)
    assert samples[("streamrec_consumer_lag_query_success", ())] == 0
    assert not [k for k in samples if k[0] == "streamrec_consumer_lag_records"]
    assert client.calls == ["list_topics"]  # asked once, at the scrape


def test_registering_lag_asks_the_broker_nothing() -> None:
    client = FakeLagClient("samples", {0: (0, 1)}, fail=True)
    metrics = LearnerMetrics()
    metrics.track_lag(LagProbe(client, "samples"))
    assert client.calls == []
    assert value(metrics.registry, "streamrec_learner_lag_query_success") == 0
    metrics.close()
    assert client.closed


# --- the status lines ------------------------------------------------------------------------

def test_learner_status_line() -> None:
    now = [T0_MS / 1000 + 42.0]
    metrics = LearnerMetrics(clock=lambda: now[0])
    status = LearnerStatus(metrics)
    assert "waiting" in status.line()
    metrics.observe_report(report(7))
    status.update(report(7))
    status.update(report(8))
    line = status.line()
    assert "micro-batch 8" in line and "samples trained 2,000" in line
    assert "AUC 0.7500" in line and "GAUC 0.7000" in line and "freshness 42s" in line
    now[0] += 600  # redrawn later, with no new micro-batch: freshness has grown
    assert "freshness 11m" in status.line()


def test_consumer_status_rate_covers_the_recent_window() -> None:
    now = [100.0]
    status = ConsumerStatus(clock=lambda: now[0], window_s=10.0)
    assert "waiting" in status.line()
    now[0] = 102.0
    status.update(batch_report(events=400, dead=("x",)))
    assert status.events_per_second() == pytest.approx(200.0)  # 400 events in the 2 s so far
    now[0] = 115.0
    status.update(batch_report(events=500, samples=10, seconds=0.25))
    assert status.events_per_second() == pytest.approx(50.0)  # the first batch left the window
    line = status.line()
    assert "events 900 (50/s)" in line and "samples 160" in line
    assert "dead letters 1" in line and "last batch 0.25s" in line
    now[0] = 200.0
    assert status.events_per_second() == 0.0  # idle: the rate falls to nothing


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(math.nan, "-"), (4.2, "4s"), (119, "119s"), (600, "10m"), (7200, "2.0h"), (3 * 86_400, "3d")],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_snapshot_bytes(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"x" * 100)
    (tmp_path / "manifest.json").write_bytes(b"{}")
    assert snapshot_bytes(tmp_path) == 102
    assert snapshot_bytes(tmp_path / "missing") is None
