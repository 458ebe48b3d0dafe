"""Whether the server can score now: a model loaded and the feature store answering.

``/readyz`` (and ``/healthz``) ask this on every probe, so the store is checked on a thread at
most once per ``cache_s`` and every probe meanwhile reads the last answer: a storm of probes
costs one Redis round trip a second, not one each. A check still running after ``timeout_s``
reads as not ready, so a store that hangs (rather than refuses) is reported as promptly as
one that is down. Before this ``/healthz`` said ``ok`` while every ``/score`` without a
history got 503.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

# A user id no event can carry (ids are printable, and this one is reserved by its prefix):
# reading its sequence is one cheap read of an absent key, through the scoring path itself.
PROBE_USER = "streamrec:readiness-probe"


class Readiness:
    """The reasons the server cannot score now (none: ready)."""

    def __init__(
        self, scorer: Any, check_store: Callable[[], object], cache_s: float, timeout_s: float
    ) -> None:
        """``check_store()`` raises when the feature store does not answer."""
        self._scorer = scorer
        self._check_store = check_store
        self.cache_s = cache_s
        self.timeout_s = timeout_s
        self._last: str | None = None
        self._checked_at = -float("inf")  # time.monotonic() of the last finished check
        self._check: asyncio.Task[str | None] | None = None
        self._check_started = 0.0

    async def reasons(self) -> list[str]:
        """What stops the server scoring now, in words; empty when it can score."""
        reasons = []
        if getattr(self._scorer, "model", None) is None:
            reasons.append("no model loaded")
        store = await self._store_reason()
        if store is not None:
            reasons.append(store)
        return reasons

    async def _store_reason(self) -> str | None:
        now = time.monotonic()
        if self._check is None:
            if now - self._checked_at < self.cache_s:
                return self._last
            self._check_started = now
            self._check = asyncio.ensure_future(asyncio.to_thread(self._run_check))
            self._check.add_done_callback(self._finished)
        remaining = self.timeout_s - (now - self._check_started)
        try:
            return await asyncio.wait_for(asyncio.shield(self._check), max(remaining, 0.0))
        except TimeoutError:
            return f"feature store did not answer within {self.timeout_s:g} s"

    def _run_check(self) -> str | None:
        try:
            self._check_store()
        except Exception as exc:  # whatever the store raises, the answer is "not ready, because"
            return f"feature store not answering: {exc}"
        return None

    def _finished(self, task: asyncio.Task[str | None]) -> None:
        self._check = None
        self._checked_at = time.monotonic()
        self._last = None if task.cancelled() else task.result()
