"""Logging set-up for the CLI only: libraries just call ``logging.getLogger(__name__)``."""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

_FORMAT = "%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"
# What differs between lines that say the same: librdkafka's "(after 3ms in state CONNECT)".
_TIMINGS = re.compile(r"\d+ms\b")


class _StderrHandler(logging.StreamHandler[TextIO]):
    """Writes to whatever ``sys.stderr`` is at emit time (test runners swap it)."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


def configure(level: str = "INFO") -> None:
    """Attach one stderr handler to the ``streamrec`` logger (idempotent)."""
    logger = logging.getLogger("streamrec")
    logger.setLevel(level.upper())
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter(_FORMAT))
        logger.addHandler(handler)
    logger.propagate = False


class RepeatedLines(logging.Filter):
    """Let through the first of like lines in each window; the next one after it counts the rest.

    Lines are alike when their level and text are, but for the milliseconds they report. Made for
    librdkafka, which logs a refused reconnect ~20 times a second while a broker is down (its own
    default: ``reconnect.backoff.ms`` at 1 s slows it to 2 a second, and every reconnect with it).
    The count rides on the first like line after the window, so an outage that ends is not
    reported again. Thread-safe; it remembers at most ``remember`` kinds of line, forgetting
    those whose window has passed first.
    """

    def __init__(
        self, window_s: float = 30.0, clock: Callable[[], float] = time.monotonic, remember: int = 1024
    ) -> None:
        """Like lines pass once a ``window_s`` by ``clock``."""
        super().__init__()
        self._window_s, self._clock, self._remember = window_s, clock, remember
        self._seen: dict[tuple[int, str], list[float]] = {}  # kind -> [window start, lines held back]
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """The kinds of line remembered."""
        return len(self._seen)

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` is shown: a line held back since is counted in it."""
        key = (record.levelno, _TIMINGS.sub("Nms", record.getMessage()))
        with self._lock:
            now = self._clock()
            seen = self._seen.get(key)
            if seen is not None and now - seen[0] < self._window_s:
                seen[1] += 1
                return False
            if len(self._seen) >= self._remember:
                self._forget(now)
            self._seen[key] = [now, 0]
        if seen is not None and seen[1]:
            held, span = int(seen[1]), now - seen[0]
            record.msg = f"{record.getMessage()} ({held} more like it in the last {span:.0f} s not shown)"
            record.args = None
        return True

    def _forget(self, now: float) -> None:
        """Forget the kinds whose window has passed, else the oldest half."""
        expired = [k for k, (start, _) in self._seen.items() if now - start >= self._window_s]
        for key in expired or list(self._seen)[: len(self._seen) // 2 + 1]:
            del self._seen[key]
