"""Event-time lateness: per-partition watermarks, both policies, redo decisions, and the
record-timestamp check; on hand-made events and the in-memory store.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME

from streamrec.config import ConsumerConfig
from streamrec.consumers.lateness import Watermarks
from streamrec.consumers.native_runner import BatchReport
from streamrec.consumers.negatives import NoveltyMatchedSampler
from streamrec.consumers.processor import BatchResult, SampleBuilder
from streamrec.events import Event
from streamrec.featurestore.memory import MemoryFeatureStore
from streamrec.kafka.records import Partition, Record
from streamrec.observability.consumer import ConsumerMetrics, reason_kind

T0 = 1_511_658_000_000
HOUR = 3_600_000
NOW = T0 + 100 * HOUR
P0, P1 = Partition("events", 0), Partition("events", 1)


def builder(**cfg: Any) -> tuple[SampleBuilder, MemoryFeatureStore]:
    store = MemoryFeatureStore(length=10)
    return SampleBuilder(ConsumerConfig(**{"negatives": 0, **cfg}), store), store


def rec(event: Event, offset: int, partition: int = 0, stamp: int | None = None) -> Record:
    """A record of ``event``, stamped with its event time unless ``stamp`` says otherwise."""
    stamp = event.ts if stamp is None else stamp
    return Record(event.to_json(), offset, partition=partition, timestamp=stamp)


def click(event_id: str, ts: int, user: str = "u") -> Event:
    return Event(event_id, user, f"i-{event_id}", "c", "pv", ts)


# --- the watermark itself -----------------------------------------------------------------


def test_an_event_is_late_when_more_than_the_allowed_lateness_behind_its_partitions_newest() -> None:
    marks = Watermarks(allowed_ms=1000)
    assert marks.judge(P0, T0) is None and marks.watermark(P0) == T0 - 1000
    assert marks.judge(P0, T0 - 1000) is None  # exactly at the watermark: on time
    assert marks.judge(P0, T0 - 1001) == 1001  # behind it: late, by how much
    assert marks.judge(P1, T0 - 5000) is None  # another partition has its own watermark
    assert marks.judge(P0, T0 + 5000) is None and marks.newest(P0) == T0 + 5000
    assert marks.judge(P0, T0) == 5000  # the watermark moved on
    assert marks.newest(P0) == T0 + 5000  # a late event never moves it back


def test_no_lateness_check_when_off_and_strict_order_at_zero() -> None:
    off = Watermarks(allowed_ms=None)
    assert off.judge(P0, T0) is None and off.judge(P0, T0 - 100 * HOUR) is None
    assert off.watermark(P0) is None
    strict = Watermarks(allowed_ms=0)
    assert strict.judge(P0, T0) is None and strict.judge(P0, T0) is None  # equal time: on time
    assert strict.judge(P0, T0 - 1) == 1


def test_a_copy_is_independent() -> None:
    marks = Watermarks(allowed_ms=0)
    marks.judge(P0, T0)
    other = marks.copy()
    other.judge(P0, T0 + HOUR)
    assert marks.newest(P0) == T0 and other.newest(P0) == T0 + HOUR


# --- the two policies -------------------------------------------------------------------


def _late_batch() -> list[Record]:
    """One partition: an on-time click, one 2 h later, then a click 90 min behind that."""
    return [rec(click("a", T0), 0), rec(click("b", T0 + 2 * HOUR), 1),
            rec(click("late", T0 + 30 * 60_000), 2), rec(click("after", T0 + 2 * HOUR + 1), 3)]


def test_sequence_only_keeps_a_late_event_in_its_sequence_without_samples() -> None:
    b, store = builder(late_events="sequence_only")
    result = b.process(_late_batch(), now_ms=NOW)
    assert [s.sample_id for s in result.samples] == ["a", "b", "after"]
    assert result.late == 1 and result.dead == [] and result.events == 4
    assert [x.event_id for x in store.sequence("u")] == ["a", "late", "b", "after"]
    after = result.samples[-1]
    assert after.seq_items == ("i-a", "i-late", "i-b")  # later histories hold it


def test_dead_letter_sends_a_late_event_to_the_dlq_and_keeps_it_out_of_sequences() -> None:
    b, store = builder(late_events="dead_letter")
    result = b.process(_late_batch(), now_ms=NOW)
    assert [s.sample_id for s in result.samples] == ["a", "b", "after"]
    assert result.late == 1 and result.events == 4
    (letter,) = result.dead
    assert letter.position.offset == 2 and letter.timestamp_ms == T0 + 30 * 60_000
    assert letter.reason.startswith("late event: ts=")
    assert "5400000 ms behind" in letter.reason and "allowed lateness 3600000 ms" in letter.reason
    assert reason_kind(letter.reason) == "late"
    assert [x.event_id for x in store.sequence("u")] == ["a", "b", "after"]


def test_an_explicit_label_that_is_late_yields_no_sample_either() -> None:
    b, _ = builder(allowed_lateness_ms=0)
    labelled = Event("r", "u", "m", "g", "rate", T0, label=1)
    result = b.process([rec(click("new", T0 + 1), 0), rec(labelled, 1)], now_ms=NOW)
    assert [s.sample_id for s in result.samples] == ["new"] and result.late == 1


def test_lateness_follows_partition_order_not_the_batchs_event_time_order() -> None:
    """A partition far behind another is not late: each partition has its own watermark."""
    b, _ = builder(allowed_lateness_ms=0)
    batch = [rec(click("p0", T0 + 10 * HOUR), 0, partition=0), rec(click("p1", T0), 0, partition=1),
             rec(click("p1b", T0 + 1), 1, partition=1)]
    result = b.process(batch, now_ms=NOW)
    assert result.late == 0 and len(result.samples) == 3


def test_lateness_off_accepts_everything_as_before() -> None:
    b, _ = builder(allowed_lateness_ms=None, late_events="dead_letter")
    result = b.process(_late_batch(), now_ms=NOW)
    assert result.late == 0 and result.dead == [] and len(result.samples) == 4


def test_a_late_resend_counts_as_a_duplicate_under_sequence_only() -> None:
    b, _ = builder()
    b.commit(b.process([rec(click("a", T0), 0), rec(click("b", T0 + 2 * HOUR), 1)], now_ms=NOW))
    again = b.process([rec(click("a", T0), 7)], now_ms=NOW)  # resent by the application, late
    assert again.duplicates == 1 and again.late == 0 and again.samples == [] and again.dead == []


def test_watermarks_carry_over_committed_batches() -> None:
    b, _ = builder()
    b.commit(b.process([rec(click("b", T0 + 2 * HOUR), 0)], now_ms=NOW))
    result = b.process([rec(click("old", T0), 1)], now_ms=NOW)
    assert result.late == 1 and result.samples == []


# --- exactly-once: the watermarks move with the batch's commit ---------------------------------


@pytest.mark.parametrize("policy", ["sequence_only", "dead_letter"])
def test_a_batch_redone_after_an_abort_decides_lateness_as_a_clean_run(policy: str) -> None:
    first = [rec(click("a", T0), 0), rec(click("b", T0 + HOUR), 1)]
    second = [rec(click("c", T0 + 3 * HOUR), 2), rec(click("late", T0 + HOUR), 3),
              rec(click("d", T0 + 3 * HOUR + 5), 4)]
    clean, _ = builder(late_events=policy)
    clean.commit(clean.process(first, now_ms=NOW))
    expected = clean.process(second, now_ms=NOW)
    assert expected.late == 1

    redo, _ = builder(late_events=policy)
    redo.commit(redo.process(first, now_ms=NOW))
    redo.process(second, now_ms=NOW)  # its transaction aborts: never committed
    again = redo.process(second, now_ms=NOW)
    assert again.samples == expected.samples and again.dead == expected.dead
    assert again.late == expected.late


def test_an_aborted_batch_does_not_move_the_watermark() -> None:
    b, _ = builder(late_events="dead_letter")
    b.commit(b.process([rec(click("a", T0), 0)], now_ms=NOW))
    b.process([rec(click("far", T0 + 10 * HOUR), 1)], now_ms=NOW)  # aborted
    # Its redo was rebalanced away; the next batch this consumer reads starts earlier.
    result = b.process([rec(click("b", T0 + 60_000), 1)], now_ms=NOW)
    assert result.late == 0 and b.watermarks.newest(P0) == T0


# --- record timestamps that are not event times --------------------------------------------


def test_record_timestamps_far_from_the_event_time_are_counted_and_warned_once_per_partition(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Kcat and producers that leave the timestamp at the send time: alignment orders by it."""
    b, _ = builder()
    sent_at = NOW  # years after the events
    batch = [rec(click(f"e{i}", T0 + i), i, partition=i % 2, stamp=sent_at) for i in range(6)]
    batch.append(rec(click("fine", T0 + 10), 6, stamp=T0 + 10 + 59_000))  # within the tolerance
    batch.append(Record(click("unstamped", T0 + 11).to_json(), 7))  # an in-memory record
    with caplog.at_level(logging.WARNING, logger="streamrec.consumers.processor"):
        result = b.process(batch, now_ms=NOW)
        again = b.process(batch, now_ms=NOW)
    assert result.timestamp_mismatches == 6 == again.timestamp_mismatches
    warnings = [r.getMessage() for r in caplog.records if "record timestamp is not" in r.getMessage()]
    assert len(warnings) == 2  # one per partition, not one per record or per batch
    assert "partition=events[0]" in warnings[0] and f"record_ts={sent_at}" in warnings[0]
    assert len(result.samples) == 8  # only reported: the events are processed as ever


def test_a_topic_stamping_records_with_the_append_time_is_told_to_change_the_topic(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With ``message.timestamp.type=LogAppendTime`` the broker overwrites every record's
    timestamp: the advice is the topic's setting, not the producer's.
    """
    b, _ = builder()
    appended = Record(click("a", T0).to_json(), 0, timestamp=NOW, timestamp_type=TIMESTAMP_LOG_APPEND_TIME)
    with caplog.at_level(logging.WARNING, logger="streamrec.consumers.processor"):
        assert b.process([appended], now_ms=NOW).timestamp_mismatches == 1
    (warning,) = [r.getMessage() for r in caplog.records if "record timestamp is not" in r.getMessage()]
    assert "message.timestamp.type to CreateTime" in warning and "the producer must" not in warning


def test_the_tolerance_is_the_builders_to_set() -> None:
    store = MemoryFeatureStore(length=10)
    b = SampleBuilder(ConsumerConfig(negatives=0), store, timestamp_tolerance_ms=1000)
    result = b.process([rec(click("a", T0), 0, stamp=T0 + 1001), rec(click("b", T0), 1, stamp=T0 - 999)],
                       now_ms=NOW)
    assert result.timestamp_mismatches == 1


# --- metrics -----------------------------------------------------------------------------------


def test_late_events_and_mismatches_are_exported() -> None:
    metrics = ConsumerMetrics()
    result = BatchResult(events=3, sampler=NoveltyMatchedSampler(1, 1, 1), late=2, timestamp_mismatches=3)
    metrics.observe_batch(BatchReport(result, 0.01, None, [P0]))
    r = metrics.registry
    assert r.get_sample_value("streamrec_consumer_late_events_total") == 2
    assert r.get_sample_value("streamrec_consumer_timestamp_mismatches_total") == 3
    assert r.get_sample_value("streamrec_consumer_dead_letters_total", {"reason": "late"}) == 0
