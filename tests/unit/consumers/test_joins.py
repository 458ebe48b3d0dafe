"""The ``join`` labelling mode on the in-memory store: impressions labelled by the clicks in
their windows, one sample each, whatever the batches, aborts and restarts.
"""

from __future__ import annotations

import random
import zlib

import pytest
from pydantic import ValidationError

from streamrec.config import ConsumerConfig
from streamrec.consumers.processor import SampleBuilder
from streamrec.datasets.feed import FeedSpec, expected_labels, generate_feed
from streamrec.events import Event
from streamrec.featurestore import FeatureStore
from streamrec.featurestore.memory import MemoryFeatureStore
from streamrec.kafka.records import Record
from streamrec.samples import Sample

T0 = 1_511_658_000_000
MINUTE = 60_000
WINDOW = 10 * MINUTE
JOIN = {"labels": "join", "label_window_ms": WINDOW, "allowed_lateness_ms": 5 * MINUTE, "negatives": 1}
NOW = 2_000_000_000_000


def builder(store: FeatureStore | None = None, **cfg: object) -> SampleBuilder:
    return SampleBuilder(ConsumerConfig(**{**JOIN, **cfg}), store or MemoryFeatureStore(length=3))


def ev(event_id: str, item: str, minute: float, action: str = "impression", user: str = "u") -> Event:
    return Event(event_id, user, item, f"c{item}", action, T0 + int(minute * MINUTE))


def records(events: list[Event], partitions: int = 1) -> list[Record]:
    """The events as a topic holds them: by user key, in publish order, offsets per partition."""
    out, next_offset = [], [0] * partitions
    for event in events:
        p = zlib.crc32(event.user_id.encode()) % partitions
        out.append(Record(event.to_json(), next_offset[p], partition=p, timestamp=event.ts))
        next_offset[p] += 1
    return out


def test_a_clicked_impression_is_a_positive_with_its_history_and_the_click_makes_no_sample() -> None:
    b = builder(negatives=0)
    batch = [ev("v", "x", -2, "pv"), ev("s1", "a", 0), ev("s2", "b", 0), ev("k", "a", 1, "click")]
    result = b.process(records(batch), now_ms=NOW)
    assert [(s.sample_id, s.label, s.item_id, s.ts, s.seq_items) for s in result.samples] == [
        ("v", 1, "x", T0 - 2 * MINUTE, ()),  # no impression before it: the sampled rule
        ("s1", 1, "a", T0, ("x",)),  # impressions are not in the sequence; the pv is
    ]


def test_a_taken_click_draws_no_negatives() -> None:
    """A click the join takes makes no sample of its own: no positive, no negatives, and no
    count of negatives it could not draw.
    """
    b = builder(negatives=1)
    # the pools hold only the clicks' own items, each in its click's history or the click's
    # own: neither click can draw a negative
    result = b.process(records([ev("s1", "a", 0), ev("k", "a", 1, "click"), ev("k2", "q", 2, "click")]),
                       now_ms=NOW)
    assert [(s.sample_id, s.label) for s in result.samples] == [("k2", 1), ("s1", 1)]
    assert result.values == [s.to_json() for s in result.samples]
    assert result.sampler.short == 1  # k2's only


def test_an_unclicked_impression_becomes_a_negative_when_the_watermark_passes_its_window() -> None:
    b = builder(negatives=0)
    first = b.process(records([ev("s1", "a", 0), ev("s2", "b", 0)]), now_ms=NOW)
    b.commit(first)
    assert first.samples == []
    # 14 minutes: the watermark (9) has not passed the window's end (10) yet
    second = b.process([Record(ev("t", "z", 14, "cart").to_json(), 2)], now_ms=NOW)
    b.commit(second)
    assert second.samples == []
    third = b.process([Record(ev("t2", "z", 16, "cart").to_json(), 3)], now_ms=NOW)
    assert sorted((s.sample_id, s.label) for s in third.samples) == [("s1", 0), ("s2", 0)]


def test_a_late_click_makes_no_sample_and_is_counted_as_a_late_label() -> None:
    b = builder(negatives=0)
    stream = [ev("s1", "a", 0), ev("t", "z", 16, "cart"), ev("k", "a", 2, "click"), ev("k2", "q", 2, "click")]
    result = b.process(records(stream), now_ms=NOW)
    assert [(s.sample_id, s.label) for s in result.samples] == [("s1", 0)]
    assert result.late_labels == 1 and result.late == 2


def test_impressions_stay_out_of_sequences_and_the_negative_pools() -> None:
    b = builder(negatives=1)
    result = b.process(records([ev("s1", "shown", 0), ev("p", "clicked", 1, "pv"),
                                ev("p2", "other", 2, "pv")]), now_ms=NOW)
    by_id = {s.sample_id: s for s in result.samples}
    assert by_id["p2"].seq_items == ("clicked",)
    assert all(s.item_id != "shown" for s in result.samples if "~n" in s.sample_id)


def test_join_needs_a_watermark_and_an_impression_action_that_is_no_click() -> None:
    with pytest.raises(ValidationError, match="needs a watermark"):
        ConsumerConfig(labels="join", allowed_lateness_ms=None)
    with pytest.raises(ValidationError, match="also a positive action"):
        ConsumerConfig(labels="join", impression_action="pv")


def run(builder_: SampleBuilder, recs: list[Record], rng: random.Random | None) -> tuple[list[Sample], int]:
    """Feed the records in batches (random ones, with aborts and restarts, when ``rng``)."""
    samples, late_labels, at = [], 0, 0
    store = builder_._store  # a restart keeps the store, not the builder
    while at < len(recs):
        end = min(len(recs), at + (rng.randint(1, 400) if rng else 250))
        if rng and rng.random() < 0.2:
            builder_.process(recs[at : min(len(recs), end + rng.randint(0, 200))], now_ms=NOW)  # aborted
            if rng.random() < 0.5:
                builder_ = SampleBuilder(builder_._cfg, store)  # and the process restarted
        result = builder_.process(recs[at:end], now_ms=NOW)
        builder_.commit(result)
        samples += result.samples
        assert result.values == [s.to_json() for s in result.samples]  # decided ones included
        late_labels += result.late_labels
        at = end
    return samples, late_labels


@pytest.mark.parametrize("seed", [0, 1])
def test_every_impression_yields_one_sample_labelled_by_its_clicks_whatever_the_batches(seed: int) -> None:
    feed = generate_feed(FeedSpec(seed=seed))
    flush = [Event(f"end-{u}", u, "z", "cz", "cart", feed.events[-1].ts + 3_600_000)
             for u in sorted({e.user_id for e in feed.events})]
    recs = records(feed.events + flush, partitions=2)
    # one partition's records in order: a restart resumes each partition at its committed offset
    clean, clean_late = run(builder(), recs, None)
    chaos, chaos_late = run(builder(), recs, random.Random(seed))

    expected = expected_labels(feed, WINDOW)
    for samples in (clean, chaos):
        ids = [s.sample_id for s in samples]
        assert len(ids) == len(set(ids)), "a sample was emitted twice"
        assert {s.sample_id: s.label for s in samples} == expected
    # The same samples; histories may differ where an aborted batch reached further than its
    # redo and stored a user's out-of-order (late) click, which the redo's histories then hold.
    def key(s: Sample) -> tuple[str, int, str]:
        return s.sample_id, s.ts, s.item_id

    assert sorted(map(key, clean)) == sorted(map(key, chaos))
    assert clean_late == chaos_late == len(feed.late_clicks)


def test_a_labelled_impression_is_an_explicit_sample_that_stays_out_of_the_sequence() -> None:
    b = builder(negatives=0)
    stream = [ev("v", "x", 0, "pv"), Event("s", "u", "a", "ca", "impression", T0 + MINUTE, 0),
              ev("w", "y", 2, "pv")]
    result = b.process(records(stream), now_ms=NOW)
    by_id = {s.sample_id: s for s in result.samples}
    assert (by_id["s"].label, by_id["s"].seq_items) == (0, ("x",))
    assert by_id["w"].seq_items == ("x",)  # not ("x", "a")
