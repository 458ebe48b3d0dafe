"""The click join's cost in Redis with the attribution window: recording a served list, and settling.

``ClickJoin.served`` (the record, then the once-a-request marker, the count and the pending entry in
one script, pipelined) against the code
before the window (the record and the count), in alternating rounds in one run, timed from the
client (a round trip on a local redis-server, Python included); then ``ClickJoin.settle`` of
``--settle`` pending lists in its bounded steps, its script's time as Redis counts it
(``INFO commandstats``). A redis-server of its own on a free port; no broker.

    .venv/bin/python bench/click_join.py [--lists 5000] [--rounds 3] [--settle 100000]

Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import redis

from streamrec.local.launch import start_redis
from streamrec.local.ports import free_port
from streamrec.serving.clicks import ClickJoin
from streamrec.snapshots.traffic import Arm, TrafficPlan

PLAN = TrafficPlan("ab", "bench", (Arm("a", 1, 5000), Arm("b", 2, 5000)))
PREFIX = "b:ab"


def served_before(client: redis.Redis, request_id: str, arm: str, version: int) -> None:
    """``ClickJoin.served`` before the window: the record and the count, one round trip."""
    field = f"{arm}\t{version}"
    pipe = client.pipeline(transaction=False)
    pipe.set(f"{PREFIX}:req:{request_id}", f"{PLAN.salt}\t{field}", ex=3600)
    pipe.hincrby(f"{PREFIX}:{{{PLAN.salt}}}:served", field, 1)
    pipe.execute()


def main() -> None:
    """Run both measurements and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lists", type=int, default=5_000, help="lists recorded a round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of each")
    parser.add_argument("--settle", type=int, default=100_000, help="pending lists to settle")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        port = free_port()
        server = start_redis("127.0.0.1", port, Path(folder))
        try:
            client = redis.Redis(port=port)
            clock = [1_000.0]
            join = ClickJoin(lambda: client, PREFIX, 3600, ("click",), window_s=60, clock=lambda: clock[0])
            micros: dict[str, list[float]] = {"before": [], "window": []}
            for rnd in range(args.rounds):
                for name in ("before", "window"):
                    start = time.perf_counter()
                    for n in range(args.lists):
                        if name == "before":
                            served_before(client, f"o{rnd}-{n}", "a", 1)
                        else:
                            join.served(PLAN, f"n{rnd}-{n}", "a", 1)
                    micros[name].append((time.perf_counter() - start) / args.lists * 1e6)
            pipe = client.pipeline(transaction=False)
            for n in range(args.settle):
                pipe.zadd(f"{PREFIX}:{{{PLAN.salt}}}:pending", {f"a\t1\tq{n}": 1_000.0})
            pipe.execute()
            client.config_resetstat()
            clock[0] += 3_600  # every pending list's window passed
            start = time.perf_counter()
            settled = join.settle(PLAN)
            wall = time.perf_counter() - start
            script = client.info("commandstats").get("cmdstat_evalsha", {})
        finally:
            server.stop()
    print(json.dumps({
        "served_us_before": [round(m, 1) for m in micros["before"]],
        "served_us_window": [round(m, 1) for m in micros["window"]],
        "ratio_median": round(statistics.median(micros["window"]) / statistics.median(micros["before"]), 3),
        "settled": settled,
        "settle_ms_wall": round(wall * 1000, 1),
        "settle_step": join.settle_step,
        "script_runs": script.get("calls"),
        "script_us_a_run": script.get("usec_per_call"),
    }))


if __name__ == "__main__":
    main()
