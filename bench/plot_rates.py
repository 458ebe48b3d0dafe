"""Draw the pipeline's stages side by side: samples a second each stage carries, with its ceiling.

Reads the last JSON line of ``bench/consumer_throughput.py`` and ``bench/learner_throughput.py``
(saved to files) and draws one PNG, so the narrowest stage shows at a glance:

    .venv/bin/python bench/consumer_throughput.py | tail -1 > consumer.json
    .venv/bin/python bench/learner_throughput.py | tail -1 > learner.json
    .venv/bin/python bench/plot_rates.py consumer.json learner.json --out docs/img/pipeline-rates.png

Prints one JSON object (the figures drawn) as its last line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def rates(consumer: dict[str, Any], learner: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Stage -> (samples/s, its ceiling's samples/s), the consumer's events turned into samples."""
    per_event = consumer["samples"] / consumer["events"]
    return {
        "consumers (one process)": (
            consumer["streamrec_events_per_s"] * per_event, consumer["ceiling_events_per_s"] * per_event
        ),
        "learner": (float(learner["streamrec_samples_per_s"]), float(learner["ceiling_samples_per_s"])),
    }


def plot(figures: dict[str, tuple[float, float]], path: Path) -> None:
    """Horizontal bars on a log scale: each stage's rate, and its ceiling as a tick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(figures)
    fig, ax = plt.subplots(figsize=(7, 2.6))
    ax.barh(names, [figures[n][0] for n in names], color="tab:blue", label="streamrec")
    ax.scatter([figures[n][1] for n in names], names, marker="|", s=400, color="black", label="ceiling")
    for k, name in enumerate(names):
        # Inside the bar's end, where no ceiling tick falls.
        ax.annotate(f"{figures[name][0]:,.0f}/s", (figures[name][0], k), xytext=(-4, -4),
                    textcoords="offset points", ha="right", color="white")
    ax.set_xscale("log")
    ax.set_xlabel("samples per second (log scale)")
    ax.set_title("samples a second each stage carries, against its ceiling")
    ax.set_xlim(left=100)
    ax.legend(loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    """Read the two benchmarks' results, draw them, print the figures."""
    parser = argparse.ArgumentParser()
    parser.add_argument("consumer", type=Path, help="consumer_throughput.py's JSON line")
    parser.add_argument("learner", type=Path, help="learner_throughput.py's JSON line")
    parser.add_argument("--out", type=Path, default=Path("pipeline-rates.png"))
    args = parser.parse_args()
    figures = rates(json.loads(args.consumer.read_text()), json.loads(args.learner.read_text()))
    plot(figures, args.out)
    print(json.dumps({"bench": "plot_rates", "samples_per_s": {k: round(v[0]) for k, v in figures.items()},
                      "ceiling_samples_per_s": {k: round(v[1]) for k, v in figures.items()}}))


if __name__ == "__main__":
    main()
