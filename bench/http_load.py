"""The serving benchmark's load clients and the CPU they and the server spend.

Two closed-loop clients measure capacity: ``wrk`` (C, one thread, when installed: a Lua script
POSTs the benchmark's request bodies in turn) and aiohttp (Python, in the benchmark's process,
used where wrk is missing: CI, say). The open loop (each request sent on its schedule, free of
coordinated omission) is aiohttp's alone: plain wrk only runs closed loops.

Each closed loop reports its own CPU time (wrk's from the kernel when it exits, aiohttp's as
the benchmark process's), and `tree_cpu_seconds` reads the server's, so a run can say what the
server alone spends a request.
"""

from __future__ import annotations

import asyncio
import os
import re
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson

CLIENTS = ("wrk", "aiohttp")
_HEADERS = {"content-type": "application/json"}
_WRK_LINE = "streamrec-wrk "  # the prefix of the line the script's done() prints


@dataclass(frozen=True)
class ClosedLoop:
    """One closed-loop run: what was answered, how fast, and the client's own CPU time."""

    client: str
    seconds: float
    answered: int
    shed: int  # 503s (wrk: every non-2xx; the bodies were each answered 200 before)
    client_cpu_s: float
    p50_ms: float
    p99_ms: float

    @property
    def requests_per_s(self) -> float:
        """Requests answered a second."""
        return self.answered / self.seconds


def default_client() -> str:
    """``wrk`` when it is on PATH, else ``aiohttp``."""
    return "wrk" if shutil.which("wrk") else "aiohttp"


def tree_cpu_seconds(pid: int) -> float | None:
    """User and system CPU seconds of process ``pid`` and every descendant alive; None off Linux."""
    proc = Path("/proc")
    if not (proc / str(pid) / "stat").exists():
        return None
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for stat in proc.glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # the process ended meanwhile
            continue
        fields = text[text.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
        child = int(stat.parent.name)
        parent[child] = int(fields[1])
        cpu[child] = (int(fields[11]) + int(fields[12])) / tick
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += cpu.get(current, 0.0)
        todo += [child for child, up in parent.items() if up == current]
    return total


def wrk_script(bodies: Sequence[bytes]) -> str:
    """A wrk Lua script that POSTs ``bodies`` in turn and prints its figures as one JSON line."""
    level = "=" * next(n for n in range(1, 100) if not any(b"]" + b"=" * n + b"]" in b for b in bodies))
    quoted = ",\n".join(f"[{level}[{b.decode()}]{level}]" for b in bodies)
    return f"""-- written by bench/http_load.py
local bodies = {{
{quoted}
}}
local requests, n = {{}}, 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
init = function(args)
  for i, body in ipairs(bodies) do requests[i] = wrk.format(nil, nil, nil, body) end
end
request = function()
  n = n % #requests + 1
  return requests[n]
end
done = function(summary, latency, _)
  local e = summary.errors
  io.write(string.format(
    '{_WRK_LINE}{{"requests": %d, "duration_us": %d, "non_2xx": %d, "socket_errors": %d, '
    .. '"p50_us": %d, "p99_us": %d}}\\n',
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""


def parse_wrk(output: str) -> dict[str, Any]:
    """The figures the script's ``done()`` printed in wrk's output.

    Raises:
        RuntimeError: the output holds no such line (wrk failed; its output is in the message).
    """
    match = re.search(rf"^{_WRK_LINE}(.*)$", output, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"wrk printed no figures:\n{output}")
    figures: dict[str, Any] = orjson.loads(match.group(1))
    return figures


def wrk_closed_loop(url: str, bodies: Sequence[bytes], seconds: float, connections: int) -> ClosedLoop:
    """``connections`` connections of one wrk thread for ``seconds``, as fast as the server answers.

    Raises:
        RuntimeError: wrk failed, or a connection broke (a socket error: not a load a server answers).
    """
    wrk = shutil.which("wrk")
    if wrk is None:
        raise RuntimeError("wrk is not installed: use --client aiohttp")
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "post.lua"
        script.write_text(wrk_script(bodies))
        before = resource.getrusage(resource.RUSAGE_CHILDREN)  # wrk is the only child reaped meanwhile
        done = subprocess.run(
            [wrk, "-t1", f"-c{connections}", f"-d{seconds:g}s", "-s", str(script), "--latency", url],
            capture_output=True, text=True, check=False,
        )
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr or done.stdout}")
    figures = parse_wrk(done.stdout)
    if figures["socket_errors"]:
        raise RuntimeError(f"wrk: {figures['socket_errors']} socket errors:\n{done.stdout}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return ClosedLoop(
        "wrk", figures["duration_us"] / 1e6, figures["requests"] - figures["non_2xx"], figures["non_2xx"],
        cpu, figures["p50_us"] / 1e3, figures["p99_us"] / 1e3,
    )


async def _aiohttp_closed_loop(
    url: str, bodies: Sequence[bytes], seconds: float, connections: int
) -> ClosedLoop:
    done = shed = 0
    latencies: list[float] = []
    async with aiohttp.ClientSession() as client:
        end = time.perf_counter() + seconds

        async def worker(offset: int) -> None:
            nonlocal done, shed
            k = offset
            while time.perf_counter() < end:
                sent = time.perf_counter()
                async with client.post(url, data=bodies[k % len(bodies)], headers=_HEADERS) as response:
                    if response.status == 503:
                        shed += 1
                    else:
                        response.raise_for_status()
                        done += 1
                    await response.read()
                latencies.append(time.perf_counter() - sent)
                k += connections

        cpu, start = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(connections)))
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    p50, p99 = np.percentile(latencies, [50, 99]) * 1e3
    return ClosedLoop("aiohttp", elapsed, done, shed, cpu, float(p50), float(p99))


def aiohttp_closed_loop(url: str, bodies: Sequence[bytes], seconds: float, connections: int) -> ClosedLoop:
    """``connections`` aiohttp clients, each sending the next request on an answer, for ``seconds``.

    A 503 (on a busy machine a request can wait past the server's ``max_queue_wait_s``) is
    counted as shed, not answered; any other failure fails the run.
    """
    return asyncio.run(_aiohttp_closed_loop(url, bodies, seconds, connections))


def closed_loop(
    client: str, url: str, bodies: Sequence[bytes], seconds: float, connections: int
) -> ClosedLoop:
    """The closed loop of ``client`` (one of `CLIENTS`)."""
    run = wrk_closed_loop if client == "wrk" else aiohttp_closed_loop
    return run(url, bodies, seconds, connections)
