"""The consumer benchmark's ceiling is a rate of reading, not of waiting: its clock, read
against a scripted consume and a clock that counts the calls made so far.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from consumer_throughput import timed_read  # noqa: E402  (bench/ is a folder of scripts)


class Script:
    """A batch consume that hands out ``batches`` in turn (0: a call that found nothing), and
    a clock that reads the number of calls made so far.
    """

    def __init__(self, batches: list[int]) -> None:
        self.batches, self.asked = list(batches), list[int]()

    def consume(self, most: int) -> int:
        self.asked.append(most)
        got = self.batches.pop(0)
        assert got <= most, "the script hands out more than was asked for"
        return got

    def clock(self) -> float:
        return float(len(self.asked))


def test_the_clock_starts_with_the_first_batch_in_hand_and_stops_at_the_last_record() -> None:
    script = Script([0, 0, 500, 500, 0, 500, 300])  # two empty calls: the assignment's start
    read, seconds = timed_read(script.consume, 1_800, 500, script.clock)
    assert read == 1_300  # the first batch is not counted: the clock starts once it is in hand
    assert seconds == 7 - 3  # from the third call's return to the seventh's


def test_no_call_asks_for_more_records_than_are_left() -> None:
    script = Script([500, 500, 300])  # one asked for 500 at the end would wait its timeout
    timed_read(script.consume, 1_300, 500, script.clock)
    assert script.asked == [500, 500, 300]


def test_a_read_that_came_in_one_batch_cannot_be_timed() -> None:
    script = Script([0, 400])
    with pytest.raises(ValueError, match="one batch"):
        timed_read(script.consume, 400, 500, script.clock)
