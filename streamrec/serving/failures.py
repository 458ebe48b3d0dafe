"""The ERROR lines of a failure that repeats, rate-limited: requests, the pointer's checks.

A feature store outage fails every request the same way: one line each buried the log under
thousands a minute (each is still answered 503 and counted in
``streamrec_serving_requests_total{status="503"}``); an export the engine cannot run failed
the pointer's check at every poll, with a traceback each. A failure is logged when it first
happens or its error changes, then at most once every ``every_s`` with how many failed since.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

# Once a minute: an outage stays visible in the log without a line per request.
EVERY_S = 60.0


class FailureLog:
    """Logs failures to ``logger``: a new error at once, a repeated one once per ``every_s``."""

    def __init__(
        self,
        logger: logging.Logger,
        what: str = "score request failed",
        outcome: str = "answered 503",
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Log that ``what`` failed, with its ``outcome``; an unchanged error at most every ``every_s``."""
        self._logger, self._what, self._outcome = logger, what, outcome
        self._every_s, self._clock = every_s, clock
        self._lock = threading.Lock()  # requests fail on the worker threads and the event loop
        self._error: str | None = None  # the error last logged
        self._logged_at = 0.0
        self._held = 0  # failures since, not logged one by one

    def failed(self, exc: BaseException) -> None:
        """Log one failure (or count it, when the same error was logged lately)."""
        error, now = str(exc) or type(exc).__name__, self._clock()  # some errors have no text
        with self._lock:
            if error == self._error and now - self._logged_at < self._every_s:
                self._held += 1
                return
            held, self._error, self._logged_at, self._held = self._held, error, now, 0
        self._logger.error(
            "%s error=%s (%s; %d more failed since the last line; a repeat is logged at most every %gs)",
            self._what, error, self._outcome, held, self._every_s,
        )
