"""The micro-batch clock keeps a fixed rate: a step's time is not added to every interval; so do its parts."""

from __future__ import annotations

from streamrec.learner.schedule import IntervalClock, PartClock


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_micro_batches_close_an_interval_apart_whatever_the_steps_take() -> None:
    clock = FakeClock()
    schedule = IntervalClock(10.0, clock)
    assert schedule.next_close() == 110.0  # the first: one interval from the start
    clock.now = 114.0  # gathered until 110, then a 4 s step
    assert schedule.next_close() == 120.0  # not 124: the step overlapped the interval
    clock.now = 121.0
    assert schedule.next_close() == 130.0


def test_a_step_longer_than_the_interval_closes_the_next_at_once_then_restarts_the_schedule() -> None:
    clock = FakeClock()
    schedule = IntervalClock(10.0, clock)
    assert schedule.next_close() == 110.0
    clock.now = 135.0  # a 25 s step: two intervals missed
    assert schedule.next_close() == 135.0  # what waits is taken now, no catching up in a burst
    clock.now = 137.0
    assert schedule.next_close() == 145.0  # one interval after the late close


def test_parts_end_every_part_s_from_the_start_and_the_last_at_the_close() -> None:
    clock = FakeClock()
    parts = PartClock(close=125.0, part_s=10.0, clock=clock)
    assert parts.next_end() == 110.0
    clock.now = 113.0  # gathered until 110, then a 3 s part trained
    assert parts.next_end() == 120.0  # fixed rate: the part's training is not added
    clock.now = 121.0
    assert parts.next_end() == 125.0  # never past the micro-batch's close: the last part is short
    clock.now = 126.0
    assert parts.next_end() == 125.0


def test_a_part_longer_than_part_s_to_train_ends_the_next_at_once_then_restarts() -> None:
    clock = FakeClock()
    parts = PartClock(close=200.0, part_s=10.0, clock=clock)
    assert parts.next_end() == 110.0
    clock.now = 134.0  # a 24 s part: what waits is the next part, no burst of empty ones
    assert parts.next_end() == 134.0
    clock.now = 135.0
    assert parts.next_end() == 144.0


def test_a_part_as_long_as_the_interval_is_the_whole_micro_batch() -> None:
    clock = FakeClock()
    assert PartClock(close=110.0, part_s=10.0, clock=clock).next_end() == 110.0
    assert PartClock(close=110.0, part_s=60.0, clock=clock).next_end() == 110.0
