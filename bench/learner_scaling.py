"""Learner ranks' scaling: two ranks, each held to one core, against one rank on one core.

Both run in this one run, one after the other, on the same samples (MovieLens latest-small,
built by the consumers' own logic, as ``learner_throughput.py``), through the ranks' own
per-micro-batch path (`streamrec.learner.ranked`): each rank decodes, encodes and scores its
own records, the ranks all-gather their samples' places (gloo) for the group's order and
exchange their ids and counts, and each trains its own samples of every mini-batch with the
gradients all-reduced; then they all-gather their samples' scores (40 bytes a sample) and each
computes the group micro-batch's report, as the learner loop does. Rank r reads the records
r, r + world, ... (as a partition share). One rank gathers micro-batches of ``--micro-batch``
samples and trains mini-batches of ``train_batch_size``; two ranks gather that many each (the
cap is per rank) and train mini-batches of twice it, half on each: the same work per sample.
Kafka is left out: its consumer is per rank and scales apart from this.

The ceiling is the one rank's rate; the figure is the two ranks' rate over it (``speedup``,
goal >= 1.7). Each rank is held to core ``rank`` (os.sched_setaffinity) with one compute
thread; the one rank to core 0. On a machine whose cores other work shares, the wall-clock
speedup is what is left of them: ``cpu_speedup`` (the one rank's CPU seconds over the busiest
of the two ranks') says what the split of the work gives on free cores, with
``load_average_1m`` beside it.

    .venv/bin/python bench/learner_scaling.py [--samples N] [--micro-batch M] [--rounds R] [--train-batch B]

``--train-batch B``: each rank's share of a mini-batch (one rank trains B, two ranks 2 x B).

Beside them, the same run measures two lone ranks at once (``--rounds`` pairs alike): two
single processes, one on each core, each training the half of the samples that a rank of two
holds, with nothing exchanged. Their CPU against the one rank's (``pair_cpu_speedup``) is what
this machine gives two processes busy at once, with no exchange at all: the ceiling of
``cpu_speedup``. Here a process does 7-15% more CPU for the same work while the other core is
busy too (bench/HISTORY.md), so the ceiling is ~1.75-1.85, not 2. ``kept_of_pair`` (the lone
pair's CPU over the two ranks') is the share of that ceiling the ranks keep; the one rank's
run cancels out of it, so on cores shared with other work it varies less between rounds.

With ``--rounds R`` the one rank, the two and the lone pair run alternately R times (each round's figures on
a line of their own); the last line, one JSON object, holds the medians and every round's
``speedup``, ``cpu_speedup``, ``pair_cpu_speedup`` and ``kept_of_pair``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
PARTITIONS = 4


def rank_main(
    out: str, samples: int, micro_batch: int, half: int | None = None, train_batch: int | None = None
) -> None:
    """One rank's run: its share of the samples, micro-batch by micro-batch; rank 0 writes the rate.

    ``half`` (0 or 1): a lone rank on core ``half`` with the samples rank ``half`` of two holds.
    """
    from learner_throughput import wire_samples

    from streamrec.config import ModelConfig
    from streamrec.kernelsettings import prefer_vector_kernels
    from streamrec.learner.columns import SampleColumns
    from streamrec.learner.din import DINLearner
    from streamrec.learner.ranked import group_step
    from streamrec.learner.ranks import GroupLayout, RankGroup, launched_world
    from streamrec.learner.reports import scored_report
    from streamrec.learner.scored import Scored, gather_scores
    from streamrec.loopsettings import before_training_loop
    from streamrec.samples import parse_sample

    prefer_vector_kernels()  # as `streamrec learner run` does, before the first matrix product
    rank, world = launched_world()
    part, parts = (rank, world) if half is None else (half, 2)
    os.sched_setaffinity(0, {part % (os.cpu_count() or 1)})

    wire = wire_samples(samples)
    mine = [(i, w) for i, w in enumerate(wire) if i % parts == part]
    group = RankGroup(rank, world, timeout_s=600.0)
    learner = DINLearner(ModelConfig() if train_batch is None else ModelConfig(train_batch_size=train_batch))
    learner.data_parallel(group.share)
    before_training_loop()  # as a rank of `streamrec learner run --workers N` does
    group.gather(np.zeros(1), "start")  # every rank ready: the clock starts together
    start, cpu = time.perf_counter(), time.process_time()
    trained = 0
    for at in range(0, len(mine), micro_batch):
        chunk = mine[at : at + micro_batch]
        own = [parse_sample(w) for _, w in chunk]
        places = np.array([[i % PARTITIONS, i] for i, _ in chunk], np.int64).ravel()
        layout = GroupLayout.of([g.reshape(-1, 2) for g in group.gather(places, "places")], rank)
        batch = SampleColumns.from_samples(own)
        result = group_step(learner, batch, layout, f"bench rank {rank}, micro-batch {at // micro_batch + 1}")
        scored = Scored.of(batch, result.probs, result.known)
        group_scores, train, dead = gather_scores(group.share.exchange, scored, result.train, 0)
        scored_report(at + 1, group_scores, replace(result, train=train), dead, 1)
        trained += layout.total
    seconds = time.perf_counter() - start
    cpus = group.gather(np.array([round((time.process_time() - cpu) * 1e9)]), "cpu")
    if rank == 0:
        busiest = max(float(c[0]) for c in cpus) / 1e9
        Path(out).write_text(json.dumps({"samples": trained, "seconds": seconds, "cpu_seconds": busiest}))


def measure(world: int, samples: int, micro_batch: int, logs: Path, extra: list[str]) -> dict[str, float]:
    """Run ``world`` ranks; rank 0's figures."""
    out = logs / f"world{world}.json"
    launch = [sys.executable, "-m", "streamrec.launch", "--nproc_per_node", str(world)]
    command = [*rank_command(out, samples, micro_batch), *extra]
    if world > 1:
        command = [*launch, "--log_dir", str(logs / f"world{world}"), *command[1:]]
    done = subprocess.run(command, env=rank_env(), capture_output=True, text=True, check=False)
    return result(f"{world} ranks", done.returncode, out, done.stdout + done.stderr)


def measure_lone_pair(samples: int, micro_batch: int, logs: Path, extra: list[str]) -> dict[str, float]:
    """Two lone ranks at once, each on its core with its half: the busier one's CPU seconds."""
    outs = [logs / f"half{h}.json" for h in (0, 1)]
    runs = [
        subprocess.Popen(
            [*rank_command(out, samples, micro_batch), *extra, "--half", str(h)],
            env=rank_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for h, out in enumerate(outs)
    ]
    output = [run.communicate()[0] for run in runs]  # read to the end: a full pipe would block it
    halves = [
        result("a lone half", run.returncode, out, text)
        for run, out, text in zip(runs, outs, output, strict=True)
    ]
    return {"cpu_seconds": max(h["cpu_seconds"] for h in halves)}


def rank_command(out: Path, samples: int, micro_batch: int) -> list[str]:
    """The command line of one rank's run (`rank_main`)."""
    here = str(Path(__file__).resolve())
    sizes = ["--samples", str(samples), "--micro-batch", str(micro_batch)]
    return [sys.executable, here, "--rank-run", str(out), *sizes]


def rank_env() -> dict[str, str]:
    """A rank's environment: one compute thread, this checkout's streamrec."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}


def result(what: str, returncode: int, out: Path, output: str) -> dict[str, float]:
    """A finished run's figures (what its rank 0 wrote); the run's output's tail if it failed."""
    if returncode != 0 or not out.exists():
        raise SystemExit(f"{what} failed ({returncode}): {output[-4000:]}")
    return json.loads(out.read_text())


def main() -> None:
    """Measure one rank, then two, ``--rounds`` times alternately; print the figures (``--help``)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=30_000)
    parser.add_argument("--micro-batch", type=int, default=2500, help="samples per rank per micro-batch")
    parser.add_argument("--rounds", type=int, default=1, help="one rank then two, this many times")
    parser.add_argument("--rank-run", help=argparse.SUPPRESS)
    parser.add_argument("--half", type=int, choices=(0, 1), help=argparse.SUPPRESS)
    parser.add_argument("--train-batch", type=int, help="a rank's mini-batch share (default: the config's)")
    args = parser.parse_args()
    extra = [] if args.train_batch is None else ["--train-batch", str(args.train_batch)]
    if args.rank_run:
        rank_main(args.rank_run, args.samples, args.micro_batch, args.half, args.train_batch)
        return
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("two ranks on two cores need two cores")
    rounds = []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            one = measure(1, args.samples, args.micro_batch, Path(tmp), extra)
            two = measure(2, args.samples, args.micro_batch, Path(tmp), extra)
            pair = measure_lone_pair(args.samples, args.micro_batch, Path(tmp), extra)
        rounds.append(figures(one, two, pair))
        print(json.dumps(rounds[-1]), flush=True)
    print(json.dumps({
        "bench": "learner_scaling",
        "samples": int(one["samples"]),
        "micro_batch_per_rank": args.micro_batch,
        "train_batch": args.train_batch or default_train_batch(),
        **{key: round(statistics.median(r[key] for r in rounds), 3) for key in rounds[0]},
        "goal": 1.7,
        "rounds": len(rounds),
        "speedups": [r["speedup"] for r in rounds],
        "cpu_speedups": [r["cpu_speedup"] for r in rounds],
        "pair_cpu_speedups": [r["pair_cpu_speedup"] for r in rounds],
        "kept_of_pairs": [r["kept_of_pair"] for r in rounds],
    }))


def default_train_batch() -> int:
    """The config's mini-batch (streamrec imported here only: the ranks import it themselves)."""
    from streamrec.config import ModelConfig

    return ModelConfig().train_batch_size


def figures(one: dict[str, float], two: dict[str, float], pair: dict[str, float]) -> dict[str, float]:
    """One round's figures: the rates, their ratio, the CPU splits and the load beside them."""
    rate_one = one["samples"] / one["seconds"]
    rate_two = two["samples"] / two["seconds"]
    return {
        "one_rank_samples_per_s": round(rate_one),
        "two_ranks_samples_per_s": round(rate_two),
        "speedup": round(rate_two / rate_one, 3),
        "cpu_speedup": round(one["cpu_seconds"] / two["cpu_seconds"], 3),
        "pair_cpu_speedup": round(one["cpu_seconds"] / pair["cpu_seconds"], 3),
        # what the ranks keep of the lone pair: the one rank's run cancels out, so this varies
        # less between rounds than either speedup on cores shared with other work
        "kept_of_pair": round(pair["cpu_seconds"] / two["cpu_seconds"], 3),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


if __name__ == "__main__":
    main()
