"""Requests that queue for one predictor run as one call: their candidates stacked.

A predictor scores one call at a time. While it runs, other requests' inputs wait for it;
when it is free the first waiting request takes every waiting one (in arrival order, up to
``max_rows`` candidates) and runs them as one call, each input's rows stacked, then hands each
request its own rows of the output. Nothing waits on purpose: a request that finds the
predictor free runs alone at once, so batching costs no latency at low load and forms batches
only when requests queue anyway (flat combining). Every input of an export has one row per
candidate first (the contract's ``-1``), so stacking requests is stacking rows.

Measured on 2 cores (docs/operating/sizing.md): one call of 400 candidates costs less than four
of 100 (the predictor's fixed cost per operator is paid once); calls of 1,000 gain no more, their
intermediates no longer fitting the caches, hence the bound.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping

import numpy as np

Feed = Mapping[str, np.ndarray]


class _Waiting:
    """One request's inputs and, once run, its output or the error of its call."""

    def __init__(self, feed: Feed) -> None:
        self.feed = feed
        self.rows = len(next(iter(feed.values())))
        self.result: np.ndarray | None = None
        self.error: BaseException | None = None
        self.done = False


class Combiner:
    """Runs inputs through ``run`` (one call at a time), combining those that wait.

    ``max_rows`` bounds a combined call's candidates; a request over it runs alone.
    """

    def __init__(self, run: Callable[[Feed], np.ndarray], max_rows: int) -> None:
        """Combine calls of ``run`` up to ``max_rows`` candidates (0 or 1: never combine)."""
        self._run = run
        self.max_rows = max_rows
        self._waiting: deque[_Waiting] = deque()
        self._queue_lock = threading.Lock()
        self._run_lock = threading.Lock()  # one call of the predictor at a time
        self.calls = 0  # predictor calls made, and the requests they answered: their ratio is the
        self.requests = 0  # mean batch

    def __call__(self, feed: Feed) -> np.ndarray:
        """The output rows of ``feed``'s candidates, from this call or one combined with others.

        Raises:
            Exception: what the predictor raised on the call that held this request.
        """
        mine = _Waiting(feed)
        with self._queue_lock:
            self._waiting.append(mine)
        while True:
            with self._run_lock:
                if not mine.done:
                    self._run_waiting()
            if mine.done:
                break
        if mine.error is not None:
            raise mine.error
        assert mine.result is not None
        return mine.result

    def _run_waiting(self) -> None:
        """Run the waiting requests at the head of the queue as one call (the run lock held)."""
        with self._queue_lock:
            batch = [self._waiting.popleft()]
            rows = batch[0].rows
            while self._waiting and rows + self._waiting[0].rows <= self.max_rows:
                rows += self._waiting[0].rows
                batch.append(self._waiting.popleft())
        try:
            if len(batch) == 1:
                outputs = [self._run(batch[0].feed)]
            else:
                stacked = {name: np.concatenate([w.feed[name] for w in batch]) for name in batch[0].feed}
                out = self._run(stacked)
                outputs = np.split(out, np.cumsum([w.rows for w in batch])[:-1])
        except Exception as exc:  # each request of the call gets its error
            for waiting in batch:
                waiting.error, waiting.done = exc, True
            return
        self.calls += 1
        self.requests += len(batch)
        for waiting, output in zip(batch, outputs, strict=True):
            waiting.result, waiting.done = output, True
