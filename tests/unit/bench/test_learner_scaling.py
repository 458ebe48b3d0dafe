"""The scaling benchmark's figures from its runs' samples, seconds and CPU seconds."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from learner_scaling import figures  # noqa: E402  (bench/ is a folder of scripts)


def test_a_rounds_figures_are_its_rates_their_ratio_and_the_cpu_splits() -> None:
    one = {"samples": 30_000, "seconds": 3.0, "cpu_seconds": 3.2}
    two = {"samples": 30_000, "seconds": 2.0, "cpu_seconds": 2.0}
    pair = {"cpu_seconds": 1.6}
    got = figures(one, two, pair)
    assert (got["one_rank_samples_per_s"], got["two_ranks_samples_per_s"]) == (10_000, 15_000)
    assert got["speedup"] == 1.5
    assert got["cpu_speedup"] == 1.6  # the one rank's CPU over the busier rank's
    assert got["pair_cpu_speedup"] == 2.0
    assert got["kept_of_pair"] == pytest.approx(got["cpu_speedup"] / got["pair_cpu_speedup"])
    slower_one = figures({**one, "cpu_seconds": 4.8}, two, pair)  # the one rank's run cancels out
    assert slower_one["kept_of_pair"] == got["kept_of_pair"] == 0.8
