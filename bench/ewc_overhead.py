"""Online EWC's cost: training time with EWC on against off, in the same run.

Both learners train the same encoded micro-batches (MovieLens latest-small samples built by
the consumers' own logic, micro-batches of 2,500, the default model and its 2^18-row item
table). EWC on adds, per step, the Fisher accumulation from the gradients already computed
and the penalty over the rows the step looked up, and once per micro-batch the decay and
the new anchor. Rounds alternate off and on so that machine noise hits both alike; the
figure is the median round's ratio, goal at most 1.2.

    .venv/bin/python bench/ewc_overhead.py [--samples N] [--rounds N]

Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from learner_throughput import MICRO_BATCH, wire_samples

from streamrec.config import ModelConfig
from streamrec.learner.columns import EncodedColumns, SampleColumns
from streamrec.learner.din import DINLearner
from streamrec.samples import Sample


def train_seconds(cfg: ModelConfig, prepared: list[EncodedColumns]) -> float:
    """Seconds a fresh learner takes to train on every micro-batch."""
    learner = DINLearner(cfg)
    start = time.perf_counter()
    for encoded in prepared:
        learner.learn_encoded(encoded)
    return time.perf_counter() - start


def main() -> None:
    """Measure and print the figures (``--help`` lists the knobs)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    wire = wire_samples(args.samples)
    off = ModelConfig()
    on = off.model_copy(update={"ewc_lambda": 100.0})
    counter = DINLearner(off)
    prepared = []
    for i in range(0, len(wire), MICRO_BATCH):
        batch = SampleColumns.from_samples([Sample.from_json(r) for r in wire[i : i + MICRO_BATCH]])
        prepared.append(counter.encode(batch))
        counter.count(batch)
    rounds = [(train_seconds(off, prepared), train_seconds(on, prepared)) for _ in range(args.rounds)]
    ratios = [t_on / t_off for t_off, t_on in rounds]
    print(json.dumps({
        "bench": "ewc_overhead",
        "samples": len(wire),
        "micro_batch": MICRO_BATCH,
        "off_samples_per_s": round(len(wire) / statistics.median(r[0] for r in rounds)),
        "on_samples_per_s": round(len(wire) / statistics.median(r[1] for r in rounds)),
        "step_time_ratio_on_to_off": round(statistics.median(ratios), 4),
        "goal_at_most": 1.2,
    }))


if __name__ == "__main__":
    main()
