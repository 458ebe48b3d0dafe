"""SampleBuilder: labels, point-in-time histories, dead letters; on the in-memory store."""

from __future__ import annotations

import random

import pytest

from streamrec.config import ConsumerConfig
from streamrec.consumers.negatives import NoveltyMatchedSampler
from streamrec.consumers.processor import BatchResult, SampleBuilder
from streamrec.events import Event
from streamrec.featurestore.memory import MemoryFeatureStore
from streamrec.kafka.records import Record
from streamrec.samples import encode_sample

T0 = 1_511_658_000_000


def records(*events: Event) -> list[Record]:
    return [Record(e.to_json(), i) for i, e in enumerate(events)]


def builder(**cfg: object) -> SampleBuilder:
    return SampleBuilder(ConsumerConfig(**cfg), MemoryFeatureStore(length=3))


def test_implicit_positive_gets_point_in_time_history_and_negatives() -> None:
    b = builder(negatives=1)
    evs = [
        Event("a", "u", "i1", "c1", "pv", T0),
        Event("b", "u", "i2", "c2", "cart", T0 + 1000),
        Event("x", "v", "i9", "c9", "pv", T0 + 1000),
        Event("c", "u", "i3", "c3", "pv", T0 + 2000),
        Event("d", "u", "i4", "c4", "pv", T0 + 2000),  # same time as c: not in c's history
    ]
    result = b.process(records(*evs), now_ms=T0 + 10_000)
    by_id = {s.sample_id: s for s in result.samples}
    assert "b" not in by_id  # cart is not a positive action by default
    assert by_id["c"].label == 1 and by_id["c"].seq_items == ("i1", "i2")
    assert by_id["d"].seq_items == ("i1", "i2")
    assert by_id["a"].seq_items == ()
    negative = by_id["c~n0"]
    assert negative.label == 0 and negative.item_id not in {"i3", "i1", "i2"}
    assert negative.seq_items == by_id["c"].seq_items and negative.ts == by_id["c"].ts


def test_a_result_holds_each_samples_wire_form() -> None:
    result = builder(negatives=1).process(records(Event("a", "u", "i1", "c1", "pv", T0)), now_ms=T0)
    assert result.values == [encode_sample(s) for s in result.samples] and len(result.values) == 1
    with pytest.raises(ValueError, match="1 samples but 0 wire forms"):  # not when the runner sends them
        BatchResult(1, NoveltyMatchedSampler(1, 1, 1), samples=result.samples)


def test_explicit_labels_need_no_sampling_and_histories_are_capped() -> None:
    b = builder(negatives=5)
    evs = [Event(f"e{i}", "u", f"m{i}", "g", "rate", T0 + i, i % 2) for i in range(6)]
    result = b.process(records(*evs), now_ms=T0 + 10_000)
    assert [s.label for s in result.samples] == [0, 1, 0, 1, 0, 1]
    assert result.samples[-1].seq_items == ("m2", "m3", "m4")  # the latest 3 earlier ones


def test_bad_records_become_dead_letters_and_the_rest_is_processed() -> None:
    b = builder(negatives=0)
    good = Event("g", "u", "i", "c", "pv", T0)
    batch = [Record(b"{oops", 0), Record(good.to_json(), 1), Record(None, 2)]
    result = b.process(batch, now_ms=T0)
    assert result.events == 1 and [s.sample_id for s in result.samples] == ["g"]
    assert [(d.position.offset, d.reason[:12]) for d in result.dead] == [
        (0, "not valid JS"),
        (2, "empty record"),
    ]


def _stream(n: int) -> list[Record]:
    """Implicit clicks of 5 users over 40 items, items reappearing, so pools matter."""
    events = (Event(f"e{i}", f"u{i % 5}", f"i{i * 7 % 40}", "c", "pv", T0 + i * 1000) for i in range(n))
    return records(*events)


def test_a_batch_redone_after_an_abort_yields_exactly_the_clean_samples() -> None:
    stream = _stream(90)
    first, second = stream[:45], stream[45:]
    clean = builder(negatives=2)
    clean.commit(a := clean.process(first, now_ms=T0 + 10**6))
    clean.commit(b := clean.process(second, now_ms=T0 + 10**6))

    redo = builder(negatives=2)
    redo.commit(redo.process(first, now_ms=T0 + 10**6))
    redo.process(second, now_ms=T0 + 10**6)  # its transaction aborts: never committed
    again = redo.process(second, now_ms=T0 + 10**6)
    assert again.samples == b.samples  # every field of every sample, negatives included
    assert len([s for s in b.samples if s.label == 0]) > 40  # negatives were really drawn
    assert a.samples != b.samples


def test_a_batch_parsed_ahead_and_redone_yields_what_a_plain_batch_does() -> None:
    """The runner parses a batch while the one before it waits on Redis, and a redo after an
    abort reuses that parse: its dead letters must not pile up, its samples must not change.
    """
    reused = Event("e3", "u3", "elsewhere", "c", "pv", T0 + 3000)  # e3's id, other content
    batch = [Record(b"{oops", 100), *_stream(30), Record(reused.to_json(), 101)]
    plain = builder(negatives=1).process(batch, now_ms=T0 + 10**6)
    b = builder(negatives=1)
    parsed = b.parse(batch, T0 + 10**6)
    ran: list[bool] = []
    first = b.process(batch, parsed=parsed, meanwhile=lambda: ran.append(True))
    again = b.process(batch, parsed=parsed)  # the first one's transaction aborted
    assert ran == [True]
    for result in (first, again):
        assert result.samples == plain.samples
        assert [d.reason for d in result.dead] == [d.reason for d in plain.dead] != []


def test_an_uncommitted_batch_changes_nothing_in_memory() -> None:
    b = builder(negatives=1)
    before = b.sampler.pool_sizes()
    b.process(_stream(20), now_ms=T0 + 10**6)
    assert b.sampler.pool_sizes() == before == (0, 0)


def test_an_event_repeated_within_a_batch_counts_once() -> None:
    b = builder(negatives=0)
    event = Event("dup", "u", "i", "c", "pv", T0)
    result = b.process(records(event, event, Event("x", "u", "j", "c", "pv", T0 + 1)), now_ms=T0)
    assert [s.sample_id for s in result.samples] == ["dup", "x"]
    assert result.samples[1].seq_items == ("i",)


def _records_at(events: list[Event], first_offset: int) -> list[Record]:
    return [Record(e.to_json(), first_offset + i) for i, e in enumerate(events)]


def test_a_resent_event_yields_nothing_and_a_reused_id_is_dead_lettered() -> None:
    b = builder(negatives=1)
    sent = [Event(f"e{i}", "u", f"i{i}", "c", "pv", T0 + i) for i in range(5)]
    b.commit(b.process(_records_at(sent, 0), now_ms=T0 + 10**6))
    reused = Event("e0", "u", "other", "c", "pv", T0 + 99)
    again = b.process(_records_at([*sent, reused], 100), now_ms=T0 + 10**6)  # resent: new offsets
    assert again.samples == [] and again.duplicates == 5 and again.events == 6
    (letter,) = again.dead
    assert "'e0' reused with other content (first at 0:0)" in letter.reason
    assert letter.position.offset == 105


def test_fuzz_resends_reuses_and_aborted_batches_never_double_a_sample() -> None:
    """Random resends, reused ids, batch cuts and aborted batches: every sample id once, and
    exactly the samples of one clean pass over the first record of each id.
    """
    rng = random.Random(5)
    originals = [
        Event(f"e{i}", f"u{i % 7}", f"i{rng.randrange(60)}", "c", "pv", T0 + i * 1000) for i in range(300)
    ]
    stream: list[Event] = []
    for event in originals:
        stream.append(event)
        if rng.random() < 0.15:  # resent by the application, maybe much later
            stream.insert(rng.randrange(len(stream), len(stream) + 30), event)
        if rng.random() < 0.05:  # the id reused for another event
            stream.append(Event(event.event_id, event.user_id, "reused", "c", "pv", event.ts))
    records = _records_at(stream, 0)

    fuzzed = builder(negatives=1)
    emitted = []
    start = 0
    while start < len(records):
        end = start + rng.randrange(1, 40)
        result = fuzzed.process(records[start:end], now_ms=T0 + 10**7)
        if rng.random() < 0.3:
            result = fuzzed.process(records[start:end], now_ms=T0 + 10**7)  # the first aborted
        fuzzed.commit(result)
        emitted += result.samples
        assert result.values == [s.to_json() for s in result.samples]  # what the runners send
        start = end
    ids = [s.sample_id for s in emitted]
    assert len(ids) == len(set(ids))
    assert {i for i in ids if "~n" not in i} == {e.event_id for e in originals}
    assert emitted == builder(negatives=1).process(_records_at(originals, 0), now_ms=T0 + 10**7).samples


def test_a_result_counts_the_negatives_its_batch_could_not_draw_or_drew_globally() -> None:
    b = builder(negatives=2, negative_history_share=1.0)
    first = b.process(_stream(20), now_ms=T0 + 60_000)
    # the first event finds no pool: its 2 negatives are short; a user's first event has no
    # history: its negatives come from the global pools
    assert first.negatives_short >= 2 and first.negatives_fallback >= 2
    assert first.negatives_short == first.sampler.short and first.negatives_fallback == first.sampler.fallback
    again = b.process(_stream(20), now_ms=T0 + 60_000)  # a redo of the uncommitted batch
    assert (again.negatives_short, again.negatives_fallback) == (
        first.negatives_short,
        first.negatives_fallback,
    )
    b.commit(first)
    later = b.process(_stream(40)[20:], now_ms=T0 + 60_000)
    assert later.negatives_short == later.sampler.short - first.sampler.short  # this batch's own
    assert later.negatives_fallback == later.sampler.fallback - first.sampler.fallback
