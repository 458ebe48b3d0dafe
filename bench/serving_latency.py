"""`streamrec serve` latency and capacity from a real HTTP load client on loopback.

A DIN with the default configuration (two tables of dim 16, sequences of 50, attention 64-32,
MLP 128-64) trained on the first 20,000 MovieLens ratings is snapshotted, exported, promoted
and served by `streamrec serve --processes N` (2: one per core here) in its own processes.
Each request scores 100 candidates for a user whose 50 behaviours travel in the request. The
load clients (`http_load`) run on the same cores as the server:

- open loop at ``--rate`` requests/s (100) for ``--seconds`` (20), aiohttp: each request is
  sent on its schedule, whether or not the ones before it have answered, so a slow server shows
  as latency instead of being hidden by the client waiting (coordinated omission); p50/p99;
- closed loop with ``--connections`` (16, spread by the kernel over the processes), as fast
  as the server answers, for 10 s: the capacity, by each of ``--client`` in turn (``wrk``, one
  C thread, the default when installed: a fifth of aiohttp's CPU a request; ``aiohttp``
  otherwise, as on CI), with the CPU a request of the server (its processes, from /proc) and of
  the client, and the cores the two kept busy;
- the sweep: the open loop at each ``--sweep`` percentage of that capacity (10, 25, 50, 75,
  100, 125) and each ``--curve`` rate, reporting p50/p99 of the answered requests and the
  share shed (503: the server's admission limits); ``--plot PATH`` draws it (PNG) for sizing
  a fleet.

Ceiling, in the same run: the same requests scored by the export's engine with no HTTP, in
as many processes as the server's, side by side (what the model itself allows on those
cores), as requests/s and scores/s, its p50 and its CPU a request (the model's time a
request). The ratio is the server's capacity over the ceiling.

Each of ``--engines`` (paddle,onnx: Paddle Inference and ONNX Runtime, `streamrec.serving.
engines`) is measured in turn on the same export, its figures under ``engines``; with both,
``onnx_over_paddle`` holds the speedups.

    .venv/bin/python bench/serving_latency.py [--processes 2] [--rate 100] [--seconds 20] \
        [--engines paddle,onnx] [--client wrk,aiohttp] [--sweep 10,25,50,75,100,125] \
        [--curve R1,R2,...] [--plot P]

Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import aiohttp
import httpx
import numpy as np
import orjson
from http_load import CLIENTS, closed_loop, default_client, tree_cpu_seconds

from streamrec.config import ConsumerConfig, ModelConfig
from streamrec.consumers.processor import SampleBuilder
from streamrec.datasets import read_events
from streamrec.featurestore import MemoryFeatureStore
from streamrec.kafka.records import Record
from streamrec.learner.columns import SampleColumns
from streamrec.learner.din import DINLearner
from streamrec.learner.snapshotting import group_state
from streamrec.serving.engines import ENGINES, EngineChoice
from streamrec.serving.export import export_snapshot
from streamrec.serving.scorer import Candidate, ExportedModel
from streamrec.snapshots.store import SnapshotStore

MOVIELENS = Path(__file__).resolve().parents[1] / "streamrec" / "demo_data" / "movielens-latest-small"
CANDIDATES = 100


def trained_snapshot(root: Path, limit: int) -> tuple[SnapshotStore, list[dict[str, Any]]]:
    """Train on MovieLens, snapshot, export and promote; return the store and 50 requests."""
    cfg = ModelConfig(device="cpu")
    events = read_events(MOVIELENS, limit=limit)
    builder = SampleBuilder(ConsumerConfig(), MemoryFeatureStore(cfg.sequence_length))
    learner = DINLearner(cfg)
    records = [Record(e.to_json(), i) for i, e in enumerate(events)]
    for i in range(0, len(records), 2500):
        result = builder.process(records[i : i + 2500])
        builder.commit(result)
        learner.learn_many(SampleColumns.from_samples(result.samples))
    store = SnapshotStore(root)
    manifest = store.write(
        group_state(learner.state_arrays()), micro_batches=1, samples_trained=0, positions=(),
        config={"model": cfg.model_dump(mode="json")},
    )
    export_snapshot(store, manifest.version)
    store.promote(manifest.version)
    rng = np.random.default_rng(0)
    items = [(e.item_id, e.category_id) for e in events]
    requests = []
    for k in range(50):
        picks = rng.integers(len(items), size=CANDIDATES + cfg.sequence_length)
        requests.append({
            "user": f"u{k}",
            "items": [f"{items[p][0]}:{items[p][1]}" for p in picks[:CANDIDATES]],
            "history": [list(items[p]) for p in picks[CANDIDATES:]],
        })
    return store, requests


def free_port() -> int:
    """A TCP port free on localhost now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(root: Path, port: int, processes: int = 1, engine: str = "auto") -> subprocess.Popen[bytes]:
    """``streamrec serve`` on the snapshots under ``root`` with ``engine``, without a feature store."""
    env = {**os.environ, "STREAMREC_LOG_LEVEL": "WARNING", "STREAMREC_SERVING__ENGINE": engine}
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamrec", "serve", "--no-store", "--snapshot-dir", str(root),
         "--port", str(port), "--processes", str(processes)],
        env=env, stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("streamrec serve did not start")


async def open_loop(
    url: str, requests: list[dict[str, Any]], rate: float, seconds: float, *, shed: list[float] | None = None
) -> list[float]:
    """Latencies (s) of requests sent on a fixed schedule, from when each was due.

    A request the server sheds (503) is appended to ``shed`` when given (its latency, how soon
    the server said no); without ``shed``, or on any other failure, the run fails.
    """
    latencies: list[float] = []
    bodies = [orjson.dumps(r) for r in requests]
    headers = {"content-type": "application/json"}
    # No client-side connection cap: requests queue at the server, whose admission limits
    # decide what is shed (a capped pool would queue them in the client, unseen by the server).
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as client:

        async def one(body: bytes, due: float) -> None:
            async with client.post(url, data=body, headers=headers) as response:
                if response.status == 503 and shed is not None:
                    await response.read()
                    shed.append(time.perf_counter() - due)
                    return
                response.raise_for_status()
                await response.read()
            latencies.append(time.perf_counter() - due)

        start = time.perf_counter()
        tasks = []
        for k in range(int(rate * seconds)):
            due = start + k / rate
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            tasks.append(asyncio.create_task(one(bodies[k % len(bodies)], due)))
        await asyncio.gather(*tasks)
    return latencies


def in_process(
    path: Path, requests: list[dict[str, Any]], seconds: float, engine: EngineChoice = "auto"
) -> tuple[int, float, list[float], float]:
    """Requests scored, seconds spent, each one's latency and the CPU seconds: the export's engine alone."""
    model = ExportedModel(path, engine=engine)
    parsed = [
        (str(r["user"]), [(h[0], h[1]) for h in r["history"]], [Candidate.parse(i) for i in r["items"]])
        for r in requests
    ]
    model.score(*parsed[0])  # the first run allocates the engine's buffers
    times = []
    end = time.perf_counter() + seconds
    k = 0
    cpu = time.process_time()
    while time.perf_counter() < end:
        user, history, candidates = parsed[k % len(parsed)]
        start = time.perf_counter()
        model.score(user, history, candidates)
        times.append(time.perf_counter() - start)
        k += 1
    return len(times), sum(times), times, time.process_time() - cpu


def batching_gain(
    path: Path, requests: list[dict[str, Any]], engine: EngineChoice = "auto", rounds: int = 20
) -> float:
    """How much faster a candidate scores in one predictor call of 10 requests' candidates.

    The time of 10 requests scored one by one over that of their 1,000 candidates scored in
    one call (for one user's history: the same work per candidate). Above 1, batching
    concurrent requests into one call would pay.
    """
    model = ExportedModel(path, engine=engine)
    parsed = [(str(r["user"]), [(h[0], h[1]) for h in r["history"]], [Candidate.parse(i) for i in r["items"]])
              for r in requests[:10]]
    together = [c for _, _, candidates in parsed for c in candidates]
    model.score(parsed[0][0], parsed[0][1], together)
    one_by_one = all_at_once = 0.0
    for _ in range(rounds):
        start = time.perf_counter()
        for user, history, candidates in parsed:
            model.score(user, history, candidates)
        one_by_one += time.perf_counter() - start
        start = time.perf_counter()
        model.score(parsed[0][0], parsed[0][1], together)
        all_at_once += time.perf_counter() - start
    return one_by_one / all_at_once


def ceiling(
    path: Path, requests: list[dict[str, Any]], seconds: float, processes: int, engine: EngineChoice = "auto"
) -> tuple[float, float, float]:
    """Requests/s, p50 latency (s) and CPU seconds a request of ``processes`` engines side by side, no HTTP.

    What the model itself allows on as many cores as the server's processes: each predictor
    in a process of its own, all at once, their rates summed.
    """
    context = multiprocessing.get_context("spawn")  # no predictor crosses a fork
    with context.Pool(processes) as pool:
        results = pool.starmap(in_process, [(path, requests, seconds, engine)] * processes)
        pool.close()  # let them exit: terminating one makes Paddle print a fatal-signal report
        pool.join()
    rate = sum(n / spent for n, spent, _, _ in results)
    cpu = sum(c for *_, c in results) / sum(n for n, *_ in results)
    return rate, float(np.percentile([t for _, _, times, _ in results for t in times], 50)), cpu


def curve_point(url: str, requests: list[dict[str, Any]], rate: float, seconds: float) -> dict[str, float]:
    """One point of the latency curve: p50/p99 of the answered requests and the share shed."""
    shed: list[float] = []
    start = time.perf_counter()
    answered = np.array(asyncio.run(open_loop(url, requests, rate, seconds, shed=shed)))
    elapsed = time.perf_counter() - start  # until the last answer: past capacity, beyond ``seconds``
    sent = len(answered) + len(shed)

    def ms(q: float) -> float:
        return round(float(np.percentile(answered, q)) * 1e3, 2) if len(answered) else float("nan")

    return {
        "offered_per_s": rate,
        "answered_per_s": round(len(answered) / elapsed, 1),
        "p50_ms": ms(50),
        "p99_ms": ms(99),
        "shed_share": round(len(shed) / sent, 4) if sent else 0.0,
    }


def plot_curve(points: list[dict[str, float]], ceiling_rps: float, path: Path) -> None:
    """Draw p50/p99 (log scale) and the share shed against offered load; write a PNG to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    offered = [p["offered_per_s"] for p in points]
    fig, latency = plt.subplots(figsize=(7, 4))
    latency.plot(offered, [p["p50_ms"] for p in points], "o-", label="p50")
    latency.plot(offered, [p["p99_ms"] for p in points], "s-", label="p99")
    latency.set_yscale("log")
    latency.set_xlabel(f"offered requests/s ({CANDIDATES} candidates each)")
    latency.set_ylabel("latency of answered requests (ms)")
    latency.axvline(ceiling_rps, color="grey", linestyle=":", label="in-process ceiling")
    shed = latency.twinx()
    shed.bar(offered, [p["shed_share"] for p in points], width=max(offered) / 40, alpha=0.25, color="red",
             label="shed (503)")
    shed.set_ylim(0, 1)
    shed.set_ylabel("share shed")
    lines, labels = latency.get_legend_handles_labels()
    more, more_labels = shed.get_legend_handles_labels()
    latency.legend(lines + more, labels + more_labels, loc="upper left")
    latency.set_title("streamrec serve: latency against offered load (open loop)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def capacity(
    client: str, url: str, server: int, requests: list[dict[str, Any]], connections: int
) -> dict[str, Any]:
    """A closed loop of ``client`` for 10 s: requests/s, its latency, and the CPU a request.

    The CPU of the server (process ``server`` and its workers) and of the load client, each a
    request, and the cores they kept busy together (2.0: both cores of this machine).
    """
    bodies = [orjson.dumps(r) for r in requests]
    before = tree_cpu_seconds(server)
    run = closed_loop(client, url, bodies, 10.0, connections)
    after = tree_cpu_seconds(server)
    server_cpu = None if before is None or after is None else after - before
    answered = max(run.answered + run.shed, 1)
    return {
        "requests_per_s": round(run.requests_per_s, 1),
        "shed": run.shed,
        "p50_ms": round(run.p50_ms, 2),
        "p99_ms": round(run.p99_ms, 2),
        "client_cpu_ms_per_request": round(run.client_cpu_s / answered * 1e3, 3),
        "server_cpu_ms_per_request": None if server_cpu is None else round(server_cpu / answered * 1e3, 3),
        "cores_busy": None if server_cpu is None else round((server_cpu + run.client_cpu_s) / run.seconds, 2),
    }


def measure(
    root: Path, requests: list[dict[str, Any]], engine: EngineChoice, args: argparse.Namespace
) -> tuple[dict[str, Any], float, list[dict[str, float]]]:
    """One engine's figures (its server, ceiling and batching gain), its ceiling and its curve."""
    export = root / "exports" / "v000001"
    ceiling_rps, ceiling_p50, model_cpu = ceiling(export, requests, 5.0, args.processes, engine)
    gain = batching_gain(export, requests, engine)
    percents = [float(r) for r in args.sweep.split(",") if r.strip()]
    rates = [float(r) for r in args.curve.split(",") if r.strip()]
    port = free_port()
    server = start_server(root, port, args.processes, engine)
    url = f"http://127.0.0.1:{port}/score"
    try:
        asyncio.run(open_loop(url, requests, args.rate, 2.0, shed=[]))  # warm-up
        shed: list[float] = []
        latencies = np.array(asyncio.run(open_loop(url, requests, args.rate, args.seconds, shed=shed)))
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).json()
        loops = {c: capacity(c, url, server.pid, requests, args.connections) for c in args.clients}
        max_rps = loops[args.clients[0]]["requests_per_s"]  # the first client's: the sweep's basis
        offered = sorted({round(max_rps * p / 100, 1) for p in percents} | set(rates))
        curve = [curve_point(url, requests, rate, args.seconds) for rate in offered]
    finally:
        server.terminate()
        server.wait(10)
    half = [p for p in curve if p["offered_per_s"] == round(max_rps * 0.5, 1)]
    figures: dict[str, Any] = {
        "engine_served": ready.get("engine"),  # what serve ran: a fallback shows here
        "requests": len(latencies) + len(shed),
        "shed_share": round(len(shed) / (len(latencies) + len(shed)), 4),
        "p50_ms": round(float(np.percentile(latencies, 50)) * 1e3, 2),
        "p99_ms": round(float(np.percentile(latencies, 99)) * 1e3, 2),
        "max_ms": round(float(latencies.max()) * 1e3, 2),
        "max_requests_per_s": round(max_rps, 1),
        "closed_loop_shed": loops[args.clients[0]]["shed"],
        # per load client: capacity, its latency, and the CPU a request of the server and the client
        "closed_loops": loops,
        "scores_per_s": round(max_rps * CANDIDATES),
        "ceiling_requests_per_s": round(ceiling_rps, 1),
        "ceiling_scores_per_s": round(ceiling_rps * CANDIDATES),
        # The model's time a request (p50, no HTTP), each process on a core of its own.
        "ceiling_p50_ms": round(ceiling_p50 * 1e3, 3),
        "model_cpu_ms_per_request": round(model_cpu * 1e3, 3),  # the same, CPU time
        "ratio": round(max_rps / ceiling_rps, 3),
        "batch_of_10_speedup": round(gain, 3),
        "p99_ms_at_half_capacity": half[0]["p99_ms"] if half else None,
    }
    if curve:
        figures["curve"] = curve
    return figures, ceiling_rps, curve


def main() -> None:
    """Measure and print the figures (``--help`` lists the knobs)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--train-events", type=int, default=20_000)
    parser.add_argument("--processes", type=int, default=2, help="server processes (one per core)")
    parser.add_argument("--connections", type=int, default=16, help="closed-loop connections")
    parser.add_argument(
        "--client", default=default_client(),
        help="closed-loop load clients, comma-separated, each measured in turn: wrk (C; the default "
        "when installed), aiohttp (Python, in this process); the first one's capacity is the sweep's basis",
    )
    parser.add_argument(
        "--engines", default="paddle,onnx",
        help="engines to measure in turn on the same export, comma-separated: paddle, onnx, auto",
    )
    parser.add_argument(
        "--sweep", default="10,25,50,75,100,125",
        help="offered loads in percent of the measured capacity, comma-separated ('' for none)",
    )
    parser.add_argument("--curve", default="", help="more offered loads (requests/s), comma-separated")
    parser.add_argument(
        "--plot", type=Path, default=None,
        help="write the curve as a PNG here (one per engine, named PATH-ENGINE.png, when several)",
    )
    args = parser.parse_args()
    names = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not names or not set(names) <= set(ENGINES):
        parser.error(f"--engines: {args.engines!r} is not a list of {', '.join(ENGINES)}")
    engines = [cast(EngineChoice, e) for e in names]
    args.clients = [c.strip() for c in args.client.split(",") if c.strip()]
    if not args.clients or not set(args.clients) <= set(CLIENTS):
        parser.error(f"--client: {args.client!r} is not a list of {', '.join(CLIENTS)}")
    if "wrk" in args.clients and shutil.which("wrk") is None:
        parser.error("--client wrk: wrk is not installed (apt-get install wrk), use --client aiohttp")
    measured: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _, requests = trained_snapshot(root, args.train_events)
        for engine in engines:
            measured[engine], ceiling_rps, curve = measure(root, requests, engine, args)
            if curve and args.plot is not None:
                path = args.plot if len(engines) == 1 else args.plot.with_stem(f"{args.plot.stem}-{engine}")
                plot_curve(curve, ceiling_rps, path)
    result: dict[str, Any] = {
        "benchmark": "serving_latency",
        "candidates_per_request": CANDIDATES,
        "processes": args.processes,
        "cores": os.cpu_count(),
        # the open loop's client and each closed loop's, on the same cores as the server
        "load_client": f"open loop: aiohttp; closed loop: {', '.join(args.clients)}; on the same machine",
        "rate": args.rate,
        "goal_requests_per_s": 1000.0,
        "goal_p99_ms": 10.0,
        "engines": measured,
    }
    if "onnx" in measured and "paddle" in measured:
        onnx, paddle = measured["onnx"], measured["paddle"]
        result["onnx_over_paddle"] = {
            "max_requests_per_s": round(onnx["max_requests_per_s"] / paddle["max_requests_per_s"], 3),
            "ceiling_requests_per_s": round(
                onnx["ceiling_requests_per_s"] / paddle["ceiling_requests_per_s"], 3
            ),
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
