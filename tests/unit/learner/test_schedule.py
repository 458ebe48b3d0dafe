"""The micro-batch clock keeps a fixed rate: a step's time is not added to every interval."""

from __future__ import annotations

from streamrec.learner.schedule import IntervalClock


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
