"""When the learner closes each micro-batch: every interval, at a fixed rate.

The n-th micro-batch closes at ``start + n * interval_s``, however long the steps before it
took: the step, the snapshot and the export of one micro-batch overlap the gathering of the
next (the samples that arrive meanwhile are read by the keep-alive polls), so a cycle is the
interval, not the interval plus a step. A sample then waits for the rest of the interval it
arrived in and one step, not two. When a step outlasts the interval the clock is behind: the
next micro-batch closes as soon as it has taken what is waiting, and the schedule starts again
from then (no burst of micro-batches to catch up).

Within a micro-batch the same holds for its parts (`PartClock`): while it is gathered, the
samples so far are scored and trained every ``part_s``, so that at its close only the last
part is left to train.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class IntervalClock:
    """The close times of successive micro-batches, ``interval_s`` apart."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        """Start the schedule at the first call of `next_close`."""
        self._interval_s = interval_s
        self._clock = clock
        self._due: float | None = None

    def next_close(self) -> float:
        """When the micro-batch being gathered from now on closes (the clock's time).

        One interval after the previous one's close time, or now when that has passed; one
        interval from now for the first.
        """
        now = self._clock()
        close = now + self._interval_s if self._due is None else max(self._due, now)
        self._due = close + self._interval_s
        return close


class PartClock:
    """The ends of one micro-batch's parts: every ``part_s`` from now, the last at its close.

    At a fixed rate, as `IntervalClock`: a part's training is not added to the next part,
    and a part that took longer than ``part_s`` to train ends the next one at once. A
    ``part_s`` at least as long as the interval makes the whole micro-batch one part.
    """

    def __init__(self, close: float, part_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        """Parts of the micro-batch closing at ``close`` (the clock's time), from now on."""
        self._close = close
        self._parts = IntervalClock(part_s, clock)

    def next_end(self) -> float:
        """When the part being gathered from now on ends: never past the micro-batch's close."""
        return min(self._parts.next_close(), self._close)
