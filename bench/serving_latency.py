"""`streamrec serve` latency and throughput from a real HTTP load client on loopback.

A DIN with the default configuration (two tables of dim 16, sequences of 50, attention 64-32,
MLP 128-64) trained on the first 20,000 MovieLens ratings is snapshotted, exported, promoted
and served by `streamrec serve` in its own process. Each request scores 100 candidates for a
user whose 50 behaviours travel in the request. The load client (aiohttp, whose C HTTP parser
costs the client least of the well-kept Python clients; one process):

- open loop at ``--rate`` requests/s (100) for ``--seconds`` (20): each request is sent on its
  schedule, whether or not the ones before it have answered, so a slow server shows as
  latency instead of being hidden by the client waiting (coordinated omission); p50/p99;
- closed loop with 4 connections, as fast as the server answers: the most requests/s.

Ceiling, in the same run: the same requests scored in process by the export's predictor, no
HTTP (what the model itself costs). The ratio is the ceiling's requests/s over the server's.

With ``--curve 25,50,100,...`` it also runs the open loop at each offered load, up to and past
capacity, and reports p50/p99 of the answered requests and the share shed (503: the server's
admission limits); ``--plot PATH`` draws that curve (PNG) for sizing a fleet.

    .venv/bin/python bench/serving_latency.py [--rate 100] [--seconds 20] [--curve R1,R2,...] [--plot P]

Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import numpy as np
import orjson

from streamrec.config import ConsumerConfig, ModelConfig
from streamrec.consumers.processor import SampleBuilder
from streamrec.datasets import read_events
from streamrec.featurestore import MemoryFeatureStore
from streamrec.kafka.records import Record
from streamrec.learner.batch import Batch
from streamrec.learner.din import DINLearner
from streamrec.learner.snapshotting import group_state
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
        learner.learn_many(Batch.from_samples(result.samples))
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


def start_server(root: Path, port: int) -> subprocess.Popen[bytes]:
    """``streamrec serve`` on the snapshots under ``root``, without a feature store."""
    env = {**os.environ, "STREAMREC_LOG_LEVEL": "WARNING"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamrec", "serve", "--no-store", "--snapshot-dir", str(root),
         "--port", str(port)],
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


async def closed_loop(url: str, requests: list[dict[str, Any]], seconds: float, connections: int) -> float:
    """Requests/s with ``connections`` clients each sending the next request on an answer."""
    done = 0
    bodies = [orjson.dumps(r) for r in requests]
    headers = {"content-type": "application/json"}
    async with aiohttp.ClientSession() as client:
        end = time.perf_counter() + seconds

        async def worker(offset: int) -> None:
            nonlocal done
            k = offset
            while time.perf_counter() < end:
                async with client.post(url, data=bodies[k % len(bodies)], headers=headers) as response:
                    response.raise_for_status()
                    await response.read()
                done += 1
                k += connections

        start = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(connections)))
        return done / (time.perf_counter() - start)


def in_process(path: Path, requests: list[dict[str, Any]], seconds: float) -> tuple[float, float]:
    """Requests/s and p50 latency (s) of the export's predictor alone on the same requests."""
    model = ExportedModel(path)
    parsed = [
        (str(r["user"]), [(h[0], h[1]) for h in r["history"]], [Candidate.parse(i) for i in r["items"]])
        for r in requests
    ]
    times = []
    end = time.perf_counter() + seconds
    k = 0
    while time.perf_counter() < end:
        user, history, candidates = parsed[k % len(parsed)]
        start = time.perf_counter()
        model.score(user, history, candidates)
        times.append(time.perf_counter() - start)
        k += 1
    return len(times) / sum(times), float(np.percentile(times, 50))


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


def main() -> None:
    """Measure and print the figures (``--help`` lists the knobs)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--train-events", type=int, default=20_000)
    parser.add_argument("--curve", default="", help="offered loads (requests/s), comma-separated")
    parser.add_argument("--plot", type=Path, default=None, help="write the curve as a PNG here")
    args = parser.parse_args()
    rates = [float(r) for r in args.curve.split(",") if r.strip()]
    curve: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store, requests = trained_snapshot(root, args.train_events)
        ceiling_rps, ceiling_p50 = in_process(root / "exports" / "v000001", requests, 5.0)
        port = free_port()
        server = start_server(root, port)
        url = f"http://127.0.0.1:{port}/score"
        try:
            asyncio.run(open_loop(url, requests, args.rate, 2.0, shed=[]))  # warm-up
            shed: list[float] = []
            latencies = np.array(asyncio.run(open_loop(url, requests, args.rate, args.seconds, shed=shed)))
            max_rps = asyncio.run(closed_loop(url, requests, 10.0, 4))
            curve = [curve_point(url, requests, rate, args.seconds) for rate in rates]
        finally:
            server.terminate()
            server.wait(10)
    result: dict[str, Any] = {
        "benchmark": "serving_latency",
        "candidates_per_request": CANDIDATES,
        "rate": args.rate,
        "requests": len(latencies) + len(shed),
        "shed_share": round(len(shed) / (len(latencies) + len(shed)), 4),
        "p50_ms": round(float(np.percentile(latencies, 50)) * 1e3, 2),
        "p99_ms": round(float(np.percentile(latencies, 99)) * 1e3, 2),
        "max_ms": round(float(latencies.max()) * 1e3, 2),
        "max_requests_per_s": round(max_rps, 1),
        "ceiling_requests_per_s": round(ceiling_rps, 1),
        "ceiling_p50_ms": round(ceiling_p50 * 1e3, 2),
        "ratio": round(max_rps / ceiling_rps, 3),
        "goal_p99_ms": 10.0,
    }
    if curve:
        result["curve"] = curve
        if args.plot is not None:
            plot_curve(curve, ceiling_rps, args.plot)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
