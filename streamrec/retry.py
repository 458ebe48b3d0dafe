"""Backoff between retries of a failing step, up to a deadline counted from the first failure."""

from __future__ import annotations

import time
from collections.abc import Callable

# The first pause: long enough for a restarting service to come back, short against a batch.
FIRST_PAUSE_S = 0.5
# The longest pause: a recovered service is noticed within this long.
MAX_PAUSE_S = 10.0


class Backoff:
    """Doubling pauses until a deadline.

    Doubling pauses (0.5 s, 1 s, 2 s ... at most 10 s) until ``deadline_s`` has passed since
    the first failure.
    """

    def __init__(self, deadline_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        """Give up ``deadline_s`` after the first `next_pause`."""
        self.deadline_s = deadline_s
        self._clock = clock
        self._started: float | None = None
        self._pause = FIRST_PAUSE_S

    def start(self) -> None:
        """Count the deadline from now (a first try) rather than from the first failure."""
        self._started = self._clock()

    def next_pause(self) -> float | None:
        """Seconds to wait before the next try, or None once the deadline has passed."""
        now = self._clock()
        if self._started is None:
            self._started = now
        left = self._started + self.deadline_s - now
        if left <= 0:
            return None
        pause, self._pause = min(self._pause, left), min(self._pause * 2, MAX_PAUSE_S)
        return pause
