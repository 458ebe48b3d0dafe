"""Samples through the consumers' logic, cut into micro-batches by count or event time."""

from __future__ import annotations

import pytest

from streamrec.config import StreamrecConfig
from streamrec.consumers.processor import SampleBuilder
from streamrec.datasets.synthetic import ClickStreamSpec, generate_clicks
from streamrec.errors import ConfigError
from streamrec.featurestore import MemoryFeatureStore
from streamrec.kafka.records import Record
from streamrec.replay.batches import build_samples, by_count, by_interval, parse_duration
from streamrec.samples import Sample

EVENTS = generate_clicks(ClickStreamSpec(events=3000, seed=4))


def test_samples_are_exactly_what_the_consumers_emit() -> None:
    cfg = StreamrecConfig()
    builder = SampleBuilder(cfg.consumer, MemoryFeatureStore(cfg.model.sequence_length))
    result = builder.process([Record(e.to_json(), i) for i, e in enumerate(EVENTS)], now_ms=EVENTS[-1].ts)
    assert build_samples(EVENTS, cfg) == result.samples  # batch boundaries change nothing


def test_by_count_and_by_interval() -> None:
    samples = build_samples(EVENTS, StreamrecConfig())
    counted = by_count(samples, 1000)
    assert [len(b.samples) for b in counted][:-1] == [1000] * (len(counted) - 1)
    assert [s for b in counted for s in b.samples] == samples
    hourly = by_interval(samples, 3_600_000)
    assert [s for b in hourly for s in b.samples] == samples
    for b in hourly:
        assert b.first_ts // 3_600_000 == b.last_ts // 3_600_000  # one aligned hour each
    assert len({b.first_ts // 3_600_000 for b in hourly}) == len(hourly)


def test_empty_input_gives_no_micro_batches() -> None:
    assert by_count([], 10) == [] and by_interval([], 10) == []


def test_durations() -> None:
    assert [parse_duration(t) for t in ("90s", "10m", "2h", "1d", "1.5h")] == [
        90_000, 600_000, 7_200_000, 86_400_000, 5_400_000
    ]
    for bad in ("10", "m", "10 minutes", "-1m"):
        with pytest.raises(ConfigError, match="not a duration"):
            parse_duration(bad)
    with pytest.raises(ConfigError):
        by_count([Sample("s", "u", 1, "i", "c", 1, (), ())], 0)


def test_a_sample_older_than_those_before_it_stays_where_it_was_emitted() -> None:
    """A join-mode negative comes out when its impression's window closes, older than the
    samples around it: it joins their micro-batch rather than opening one of its own.
    """
    hour = 3_600_000

    def sample(i: int, ts: int) -> Sample:
        return Sample(f"s{i}", "u", ts, "i", "c", 0, (), ())

    samples = [sample(0, 10 * hour), sample(1, 11 * hour), sample(2, 10 * hour + 5), sample(3, 11 * hour + 9)]
    batches = by_interval(samples, hour)
    assert [[s.sample_id for s in b.samples] for b in batches] == [["s0"], ["s1", "s2", "s3"]]
    assert (batches[1].first_ts, batches[1].last_ts) == (10 * hour + 5, 11 * hour + 9)


def test_a_last_micro_batch_too_small_to_judge_joins_the_one_before() -> None:
    """By count, 100,004 samples made 40 micro-batches of 2,500 and one of 4 (AUC nan), which
    the figures counted as a micro-batch of its own.
    """
    samples = build_samples(EVENTS, StreamrecConfig())
    size = len(samples) // 3
    tail = len(samples) - 3 * size
    assert 0 < tail < 50
    merged = by_count(samples, size, min_size=50)
    assert [len(b.samples) for b in merged] == [size, size, size + tail]
    assert [s for b in merged for s in b.samples] == samples
    assert [len(b.samples) for b in by_count(samples, size, min_size=tail)] == [size] * 3 + [tail]
    assert [len(b.samples) for b in by_count(samples[:10], 100, min_size=50)] == [10]  # nothing before it
