"""A bound on the score requests in flight and on the time each waits for a worker.

Requests are scored on a pool of worker threads, never on the event loop, so the loop keeps
reading requests, answering probes and shedding while the workers are busy. The only queue is
the requests admitted but waiting for a worker: at most ``max_in_flight`` requests are admitted
(one more is refused at once), and an admitted one that finds no free worker within
``max_wait_s`` of its arrival is refused too. Refusals are `Overloaded`; the HTTP layer
answers them 503 with ``Retry-After``. Before this, scoring ran on the event loop itself:
requests queued unseen in the loop and the socket, a 2-core machine offered twice what it could
score answered after 19-41 s, and nothing was refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class Overloaded(Exception):
    """No room for a request now; its message is the 503 response's reason."""

    def __init__(self, reason: str, cause: str) -> None:
        """``reason`` for the client, ``cause`` (``in_flight`` or ``queue_wait``) for metrics."""
        super().__init__(reason)
        self.cause = cause


class Admission:
    """Admits score requests up to ``max_in_flight`` and runs them on ``workers`` threads."""

    def __init__(self, workers: int, max_in_flight: int, max_wait_s: float) -> None:
        """A pool of ``workers`` threads; see the module docstring for the two bounds."""
        self.workers = workers
        self.max_in_flight = max_in_flight
        self.max_wait_s = max_wait_s
        self.in_flight = 0
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="streamrec-score")
        self._slots: asyncio.Semaphore | None = None  # made on the loop that serves

    @contextlib.contextmanager
    def admitted(self) -> Iterator[None]:
        """Hold one of the ``max_in_flight`` places for the request's whole handling.

        Raises:
            Overloaded: every place is taken.
        """
        if self.in_flight >= self.max_in_flight:
            reason = f"{self.in_flight} requests in flight, at most {self.max_in_flight}"
            raise Overloaded(reason, "in_flight")
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    async def run(self, work: Callable[[], T], since: float) -> tuple[T, float]:
        """Run ``work()`` on a worker thread.

        ``work()`` on a worker thread, and the seconds from ``since`` (``perf_counter``,
        the request's arrival) until a worker took it.

        Raises:
            Overloaded: no worker was free ``max_wait_s`` after ``since``.
        """
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.workers)
        slots = self._slots
        if slots.locked():
            remaining = self.max_wait_s - (time.perf_counter() - since)
            try:
                async with asyncio.timeout(remaining):
                    await slots.acquire()
            except TimeoutError:
                raise Overloaded(f"no worker free within {self.max_wait_s:g} s", "queue_wait") from None
        else:
            await slots.acquire()  # free: returns at once
        waited = time.perf_counter() - since
        loop = asyncio.get_running_loop()

        def release(_: Future[T]) -> None:
            # when the thread is done, not when the awaiting request is: a request cancelled
            # meanwhile must not let more work in than there are workers
            with contextlib.suppress(RuntimeError):  # the loop closed at shutdown
                loop.call_soon_threadsafe(slots.release)

        future = self._pool.submit(work)
        future.add_done_callback(release)
        return await asyncio.wrap_future(future), waited

    def close(self) -> None:
        """Stop the workers once their requests are done; waiting ones are dropped."""
        self._pool.shutdown(wait=False, cancel_futures=True)
