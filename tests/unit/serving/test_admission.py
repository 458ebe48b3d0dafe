"""Admission's worker threads: a request's work runs off the event loop and its result or error
comes back; a slot is free again only when the work is done, even for a request cancelled
meanwhile; no worker free within the wait is a 503's `Overloaded`; closing drops waiting work.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from streamrec.serving.admission import Admission, Overloaded


def test_work_runs_on_a_worker_thread_and_its_result_comes_back() -> None:
    admission = Admission(workers=2, max_in_flight=4, max_wait_s=1.0)

    async def main() -> tuple[str, float]:
        return await admission.run(lambda: threading.current_thread().name, time.perf_counter())

    name, waited = asyncio.run(main())
    assert name.startswith("streamrec-score") and 0 <= waited < 1.0
    admission.close()


def test_the_work_s_error_is_raised_in_the_request() -> None:
    admission = Admission(workers=1, max_in_flight=4, max_wait_s=1.0)

    def fails() -> None:
        raise ValueError("bad feature")

    async def main() -> None:
        await admission.run(fails, time.perf_counter())

    with pytest.raises(ValueError, match="bad feature"):
        asyncio.run(main())
    admission.close()


def test_a_cancelled_request_holds_its_worker_until_its_work_is_done() -> None:
    admission = Admission(workers=1, max_in_flight=4, max_wait_s=0.05)
    started, finish = threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        finish.wait(5)
        return "done"

    async def main() -> str:
        first = asyncio.create_task(admission.run(slow, time.perf_counter()))
        while not started.is_set():
            await asyncio.sleep(0.001)
        first.cancel()
        with pytest.raises(Overloaded, match="no worker free"):  # the worker still runs slow()
            await admission.run(lambda: "second", time.perf_counter())
        finish.set()
        result, _ = await admission.run(lambda: "third", time.perf_counter())
        return result

    assert asyncio.run(main()) == "third"
    admission.close()


def test_many_requests_on_few_workers_all_come_back_in_full() -> None:
    admission = Admission(workers=2, max_in_flight=100, max_wait_s=5.0)

    async def main() -> list[int]:
        runs = [admission.run(lambda k=k: k * k, time.perf_counter()) for k in range(50)]  # type: ignore[misc]
        return [result for result, _ in await asyncio.gather(*runs)]

    assert asyncio.run(main()) == [k * k for k in range(50)]
    admission.close()
