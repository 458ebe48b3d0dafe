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
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

# A job for a worker: the work, the request's future, its loop and the slots to free when done.
_Job = tuple[Callable[[], Any], "asyncio.Future[Any]", asyncio.AbstractEventLoop, asyncio.Semaphore]


#: Why a request is shed: every place taken, or no worker free within the queue's bound.
SHED_CAUSES = ("in_flight", "queue_wait")


class Overloaded(Exception):
    """No room for a request now; its message is the 503 response's reason."""

    def __init__(self, reason: str, cause: str) -> None:
        """``reason`` for the client, ``cause`` (one of `SHED_CAUSES`) for metrics."""
        super().__init__(reason)
        self.cause = cause


class Admission:
    """Admits score requests up to ``max_in_flight`` and runs them on ``workers`` threads.

    The threads are its own rather than a ``ThreadPoolExecutor``'s: a request's work goes to a
    worker through one queue and comes back, with its slot freed, in one call on the event loop,
    where the executor and ``asyncio.wrap_future`` took two calls into the loop from the thread
    and a concurrent future's locks and callbacks (about 15 µs of the 230 a request costs outside
    the model and the sockets, measured in process with the model stubbed out).
    """

    def __init__(self, workers: int, max_in_flight: int, max_wait_s: float) -> None:
        """``workers`` threads, started by the first request; the two bounds: the module docstring."""
        self.workers = workers
        self.max_in_flight = max_in_flight
        self.max_wait_s = max_wait_s
        self.in_flight = 0
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
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
        if not self._threads:
            self._start()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._jobs.put((work, future, loop, slots))
        return await future, waited

    def _start(self) -> None:
        for k in range(self.workers):
            thread = threading.Thread(target=self._work, name=f"streamrec-score_{k}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _work(self) -> None:
        """A worker: each job's work, its outcome handed to the job's loop, until told to stop."""
        while (job := self._jobs.get()) is not None:
            work, future, loop, slots = job
            try:
                result, error = work(), None
            except BaseException as exc:  # the request's to raise, as an executor would hand it on
                result, error = None, exc
            with contextlib.suppress(RuntimeError):  # the loop closed at shutdown
                loop.call_soon_threadsafe(_settle, future, slots, result, error)

    def close(self) -> None:
        """Stop the workers once their requests are done; waiting ones are dropped."""
        with contextlib.suppress(queue.Empty):
            while True:
                job = self._jobs.get_nowait()
                if job is not None:
                    with contextlib.suppress(RuntimeError):
                        job[2].call_soon_threadsafe(job[1].cancel)
        for _ in self._threads:
            self._jobs.put(None)


def _settle(
    future: asyncio.Future[Any], slots: asyncio.Semaphore, result: object, error: BaseException | None
) -> None:
    """On the loop: free the worker's slot and give the request its outcome, unless it was cancelled.

    The slot is freed when the work is done, not when the awaiting request is: a request
    cancelled meanwhile must not let more work in than there are workers.
    """
    slots.release()
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
