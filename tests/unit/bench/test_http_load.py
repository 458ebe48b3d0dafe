"""The serving benchmark's load clients: wrk when installed (not needed here), aiohttp otherwise,
each closed loop with its own CPU time, and the server's CPU read from /proc.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import http_load  # noqa: E402  (bench/ is a folder of scripts)
from http_load import (  # noqa: E402
    aiohttp_closed_loop,
    default_client,
    parse_wrk,
    tree_cpu_seconds,
    wrk_closed_loop,
    wrk_script,
)

from tests.unit.bench.shedding import shedding_server  # noqa: E402

WRK_OUTPUT = """Running 1s test @ http://127.0.0.1:8000/score
  1 threads and 4 connections
  Latency Distribution
     50%    2.10ms
     99%    9.00ms
  1200 requests in 1.00s, 300.00KB read
streamrec-wrk {"requests": 1200, "duration_us": 1000500, "non_2xx": 3, "socket_errors": 0, \
"p50_us": 2100, "p99_us": 9000}
Requests/sec:   1199.40
"""


def test_wrk_is_the_default_only_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_load.shutil, "which", lambda name: None)
    assert default_client() == "aiohttp"
    monkeypatch.setattr(http_load.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert default_client() == "wrk"


def test_the_script_holds_every_body_and_prints_one_line() -> None:
    bodies = [b'{"user": "u1", "items": ["1"]}', b'{"user": "]=]", "items": ["2"]}']
    script = wrk_script(bodies)
    assert '[==[{"user": "u1", "items": ["1"]}]==]' in script  # a level no body closes early
    assert '[==[{"user": "]=]", "items": ["2"]}]==]' in script
    assert "streamrec-wrk " in script and "done = function" in script


def test_wrk_figures_are_read_from_its_output() -> None:
    figures = parse_wrk(WRK_OUTPUT)
    assert figures == {"requests": 1200, "duration_us": 1000500, "non_2xx": 3, "socket_errors": 0,
                       "p50_us": 2100, "p99_us": 9000}
    with pytest.raises(RuntimeError, match="no figures"):
        parse_wrk("unable to connect to 127.0.0.1:1 Connection refused")


def test_a_process_tree_s_cpu_is_read() -> None:
    if not Path("/proc/self/stat").exists():
        pytest.skip("no /proc: not Linux")
    end = time.process_time() + 0.05
    while time.process_time() < end:  # spend some CPU to see
        pass
    cpu = tree_cpu_seconds(os.getpid())
    assert cpu is not None and cpu >= 0.05
    assert tree_cpu_seconds(2**22 + 7) is None  # no such process


@pytest.fixture
def server() -> Iterator[str]:
    """A score endpoint on a thread of its own that sheds every third request."""
    ready = threading.Event()
    url: list[str] = []
    loops: list[asyncio.AbstractEventLoop] = []
    done: list[asyncio.Event] = []

    async def serve() -> None:
        async with shedding_server(3) as address:
            url.append(address)
            loops.append(asyncio.get_running_loop())
            done.append(asyncio.Event())
            ready.set()
            await done[0].wait()

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    assert ready.wait(10)
    yield url[0]
    loops[0].call_soon_threadsafe(done[0].set)
    thread.join(10)


def test_the_aiohttp_closed_loop_counts_the_shed_and_its_own_cpu(server: str) -> None:
    run = aiohttp_closed_loop(server, [b'{"user": "u1"}'], 0.3, 2)
    assert run.client == "aiohttp" and run.answered > 0 and run.shed > 0
    assert run.shed <= run.answered  # one in three shed
    assert run.client_cpu_s > 0 and 0 < run.p50_ms <= run.p99_ms
    assert run.requests_per_s == pytest.approx(run.answered / run.seconds)


@pytest.mark.skipif(
    shutil.which("wrk") is None, reason="wrk is not installed (the benchmark falls back to aiohttp)"
)
def test_wrk_s_closed_loop_counts_non_2xx_as_shed(server: str) -> None:
    run = wrk_closed_loop(server, [b'{"user": "u1"}', b'{"user": "u2"}'], 1.0, 2)
    assert run.client == "wrk" and run.answered > 0 and run.shed > 0
    assert run.client_cpu_s > 0 and 0 < run.p50_ms <= run.p99_ms
