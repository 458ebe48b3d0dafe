"""EventTimeAligner: event-time release order, holding back for empty partitions, pause hints.

Time is injected: the idle wait runs on a fake clock, so nothing here sleeps.
"""

from __future__ import annotations

from streamrec.kafka.alignment import EventTimeAligner
from streamrec.kafka.records import Partition, Record


class Clock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def msg(part: int, ts: int, off: int = 0) -> Record:
    return Record(b"", off, topic="t", partition=part, timestamp=ts)


def end(*parts: int) -> list[Partition]:
    return [Partition("t", p) for p in parts]


def aligner(
    parts: int = 3, skew: int = 100, idle_ms: int = 60_000, max_buffered: int = 20_000
) -> tuple[EventTimeAligner[Record], Clock]:
    clock = Clock()
    a: EventTimeAligner[Record] = EventTimeAligner(
        skew, idle_ms=idle_ms, max_buffered=max_buffered, clock=clock
    )
    a.assign(end(*range(parts)))
    return a, clock


def ts_of(msgs: list[Record]) -> list[int]:
    return [m.timestamp()[1] for m in msgs]


def test_records_come_out_in_event_time_order_up_to_the_skew() -> None:
    a, _ = aligner()
    out = a.push([msg(0, 1000), msg(0, 5000), msg(1, 1050), msg(2, 990), msg(2, 1200)])
    # Watermark: the slowest partition's head is 1050 (partition 1): release <= 1150.
    assert ts_of(out) == [990, 1000, 1050]
    assert a.buffered() == 2
    out = a.push([msg(1, 6000)])
    assert ts_of(out) == [1200]  # partition 2 (head 1200) is live and now the slowest
    assert ts_of(a.push([msg(2, 7000)])) == [5000]  # the watermark is now 5000


def test_only_a_prefix_per_partition_is_released() -> None:
    a, _ = aligner(parts=2)
    out = a.push([msg(0, 500, off=0), msg(0, 100, off=1), msg(0, 900, off=2), msg(1, 150)])
    # Offset 1 (ts 100) never overtakes offset 0 (ts 500, beyond 150 + 100): offset 0 goes
    # first, out of event-time order (counted), and offset 2 (ts 900) waits.
    assert [(m.partition(), m.offset()) for m in out] == [(0, 0), (0, 1), (1, 0)]
    assert a.forced == 1 and a.buffered() == 1


def test_an_empty_partition_holds_the_others_back_until_idle() -> None:
    a, clock = aligner(idle_ms=50)
    assert a.push([msg(0, 1000), msg(1, 1000)]) == []  # partition 2 unheard: wait
    clock.advance(0.049)
    assert a.push([]) == []  # still within the idle wait
    clock.advance(0.002)
    assert ts_of(a.push([])) == [1000, 1000]
    assert ts_of(a.push([msg(2, 900), msg(0, 2000)])) == [900]
    # 1 and 2 reach their ends: partition 0's record waits for them, then goes.
    assert a.push([], at_end=end(1, 2)) == []
    clock.advance(0.051)
    assert ts_of(a.push([])) == [2000]


def test_a_partition_waited_for_holds_nothing_back_again_until_it_delivers() -> None:
    """A silent partition is waited for once, not again at each release: before, every limited
    release waited ``idle_ms`` anew, so a consumer with one empty partition delivered ``limit``
    records per ``idle_ms`` (30 every 2 s in a learner rank's parts).
    """
    a, clock = aligner(parts=2, idle_ms=50)
    assert a.push([msg(0, t) for t in range(1000, 1100)], at_end=end(1), limit=30) == []
    clock.advance(0.051)
    assert ts_of(a.push([], limit=30)) == list(range(1000, 1030))
    assert ts_of(a.push([], limit=30)) == list(range(1030, 1060))  # partition 1 is still silent
    assert len(a.push([], limit=100)) == 40 and a.buffered() == 0
    assert ts_of(a.push([msg(0, 1200)])) == [1200]  # partition 0 drained and refilled
    assert ts_of(a.push([msg(1, 1150)])) == [1150]  # partition 1 delivers: heard from again
    assert a.push([msg(0, 1300)], at_end=end(1)) == []  # and at its end once more: waited for
    clock.advance(0.051)
    assert ts_of(a.push([])) == [1300]


def test_all_partitions_at_end_release_everything_after_idle() -> None:
    a, clock = aligner(parts=2, idle_ms=1)
    assert ts_of(a.push([msg(0, 10), msg(0, 9000), msg(1, 20)], at_end=end(1))) == [10, 20]
    assert a.push([], at_end=end(0)) == []
    clock.advance(0.002)
    assert ts_of(a.push([])) == [9000]
    assert a.buffered() == 0


def test_records_of_unassigned_partitions_are_ignored() -> None:
    a, _ = aligner(parts=1)
    assert a.push([msg(5, 10)]) == [] and a.buffered() == 0


def test_full_buffers_ask_for_a_pause_until_drained_to_half() -> None:
    a, _ = aligner(parts=2, max_buffered=10)
    a.push([msg(0, i) for i in range(10)])
    assert a.full() == {Partition("t", 0)}  # partition 1 unheard: everything is held
    a.push([msg(1, 4)])  # watermark 4: partition 0 releases ts <= 104, all ten
    assert a.full() == set()
    a.push([msg(0, 1000 + i) for i in range(10)])
    assert a.full() == {Partition("t", 0)}
    a.assign(end(0, 1))
    assert a.full() == set() and a.buffered() == 0


def test_a_limited_release_is_a_prefix_of_every_partition_merged_by_time() -> None:
    a, _ = aligner(parts=2, skew=10_000)
    p0 = [msg(0, ts, off) for off, ts in enumerate([10, 30, 20, 50])]  # not monotonic
    p1 = [msg(1, ts, off) for off, ts in enumerate([15, 25, 40])]
    first = a.push([*p0, *p1], limit=4)
    assert [(m.partition(), m.offset()) for m in first] == [(0, 0), (1, 0), (1, 1), (0, 1)]
    rest = a.push([], limit=10)
    assert [(m.partition(), m.offset()) for m in rest] == [(0, 2), (1, 2), (0, 3)]
    assert a.buffered() == 0


def test_a_record_stamped_far_ahead_of_its_own_partition_does_not_stall_it() -> None:
    """One record an hour ahead once held its partition back for as long as traffic flowed."""
    a, clock = aligner(parts=2, skew=100)
    out = a.push([msg(0, 1000, 0), msg(0, 3_600_000, 1), msg(0, 1010, 2), msg(1, 1000), msg(1, 1020)])
    released = [(m.partition(), m.offset()) for m in out]
    assert (0, 1) in released and (0, 2) in released  # the outlier went, and what followed it
    assert a.forced == 1


def test_no_partition_is_held_longer_than_the_bound() -> None:
    a, clock = aligner(parts=2, skew=100)
    a.push([msg(0, 5000, 0), msg(0, 5001, 1), msg(1, 1000)])  # partition 0 is simply ahead
    clock.advance(299)
    assert a.push([]) == []  # aligned: held while partition 1 catches up
    clock.advance(2)
    assert [m.offset() for m in a.push([])] == [0, 1]  # held 5 minutes: released anyway
    assert a.forced == 2
