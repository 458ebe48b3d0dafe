"""The pipeline-rates plot turns the consumer's events into samples and draws both stages."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from plot_rates import plot, rates  # noqa: E402  (bench/ is a folder of scripts)


def test_the_consumers_events_become_samples_and_both_stages_are_drawn(tmp_path: Path) -> None:
    consumer = {
        "events": 1000, "samples": 1800, "streamrec_events_per_s": 30_000, "ceiling_events_per_s": 60_000,
    }
    learner = {"streamrec_samples_per_s": 1_800, "ceiling_samples_per_s": 1_850}
    figures = rates(consumer, learner)
    assert figures == {"consumers (one process)": (54_000.0, 108_000.0), "learner": (1_800.0, 1_850.0)}
    plot(figures, tmp_path / "rates.png")
    assert (tmp_path / "rates.png").read_bytes()[:4] == b"\x89PNG"
