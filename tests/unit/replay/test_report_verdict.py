"""The DIN against the simple baselines: a difference within the micro-batches' noise is a tie."""

from __future__ import annotations

import math
from typing import Any

import pytest

from streamrec.cli.replay import _verdict
from streamrec.replay.report import paired, tied_with_best, versus_baselines


def strategy(gaucs: list[float], samples: list[int] | None = None) -> dict[str, Any]:
    samples = samples or [1000] * len(gaucs)
    gauc = sum(g * n for g, n in zip(gaucs, samples, strict=True)) / sum(samples)
    return {"gauc": gauc, "train_seconds": 1.0, "series": {"gauc": gaucs, "samples": samples}}


def test_the_paired_difference_is_the_whole_runs_and_its_error_comes_from_its_spread() -> None:
    a = strategy([0.70, 0.72, 0.68, 0.71], [1000, 1000, 2000, 500])
    b = strategy([0.69, 0.70, 0.68, 0.69], [1000, 1000, 2000, 500])
    got = paired(a, b)
    assert got["difference"] == pytest.approx(a["gauc"] - b["gauc"])
    d, w = [0.01, 0.02, 0.0, 0.02], [1000, 1000, 2000, 500]
    mean = sum(x * n for x, n in zip(d, w, strict=True)) / sum(w)
    spread = sum(n * (x - mean) ** 2 for x, n in zip(d, w, strict=True))
    assert got["stderr"] == pytest.approx(math.sqrt(spread / (3 * sum(w))))
    assert got["micro_batches"] == 4


def test_a_micro_batch_either_cannot_score_is_left_out_of_the_pairs() -> None:
    got = paired(strategy([0.7, math.nan, 0.7]), strategy([0.6, 0.6, math.nan]))
    assert got["micro_batches"] == 1 and got["difference"] == pytest.approx(0.1)
    assert math.isnan(got["stderr"])


def test_ahead_in_every_micro_batch_beats_ahead_on_average_by_noise_ties_behind_is_behind() -> None:
    base = strategy([0.60, 0.62, 0.61, 0.63, 0.60, 0.62])
    steady = strategy([0.61, 0.63, 0.62, 0.64, 0.61, 0.63])  # +0.01 in each
    noisy = strategy([0.66, 0.57, 0.66, 0.58, 0.65, 0.61])  # +0.008 on average, ±0.05 apiece
    behind = strategy([0.59, 0.61, 0.60, 0.62, 0.59, 0.61])
    for din, outcome in ((steady, "beats"), (noisy, "ties"), (behind, "behind")):
        versus = versus_baselines({"popularity": base, "finetune": din})
        assert versus is not None and versus["outcome"] == outcome, versus
    assert noisy["gauc"] > base["gauc"]  # ahead on the whole-run figure, which alone said "beats"


def test_the_best_baseline_is_the_one_compared_and_one_micro_batch_cannot_tell() -> None:
    strategies = {
        "popularity": strategy([0.5, 0.5]), "item-rate": strategy([0.6, 0.62]),
        "finetune": strategy([0.7, 0.7]),
    }
    versus = versus_baselines(strategies)
    assert versus is not None and versus["baseline"] == "item-rate"
    one = versus_baselines({"popularity": strategy([0.5]), "finetune": strategy([0.7])})
    assert one is not None and one["outcome"] == "unknown"
    assert versus_baselines({"finetune": strategy([0.7])}) is None
    assert versus_baselines({"popularity": strategy([0.7])}) is None


def test_the_cli_says_a_tie_and_how_large_the_noise_is() -> None:
    base = strategy([0.60, 0.62, 0.61, 0.63, 0.60, 0.62])
    noisy = strategy([0.66, 0.57, 0.66, 0.58, 0.65, 0.61])
    strategies = {"popularity": base, "finetune": noisy}
    report = {
        "strategies": strategies, "best": {"gauc": "finetune"},
        "versus_baselines": versus_baselines(strategies),
    }
    line = _verdict(report)
    said = "finetune) ties with the best simple baseline (popularity) on GAUC: +0.0083 ± 0.0421 over"
    assert said in line, line
    assert "over 6 micro-batches" in line


def test_strategies_within_the_noise_of_the_best_are_named_as_tied_with_it() -> None:
    strategies = {
        "popularity": strategy([0.50, 0.52, 0.51, 0.50]),
        "finetune": strategy([0.70, 0.72, 0.71, 0.73]),
        "ewc": strategy([0.71, 0.71, 0.70, 0.73]),  # -0.0025 on average, ±0.01 apiece
    }
    assert tied_with_best(strategies, "gauc") == ["ewc"]
    report = {
        "strategies": strategies, "best": {"gauc": "finetune"},
        "tied_with_best": {"gauc": ["ewc"]}, "versus_baselines": versus_baselines(strategies),
    }
    assert _verdict(report).startswith("best GAUC: finetune (0.7150, 1.0 s training; ewc ties with it);")
    assert tied_with_best({"finetune": strategy([0.7]), "ewc": strategy([0.69])}, "gauc") == []


def test_identical_figures_are_a_tie_even_from_one_micro_batch() -> None:
    """Found by a tour (test first): a backtest of one micro-batch where popularity, item-rate
    and features all scored GAUC 0.5000 named popularity the best, and no tie.
    """
    strategies = {name: strategy([0.5]) for name in ("popularity", "item-rate", "features", "finetune")}
    assert tied_with_best(strategies, "gauc") == ["item-rate", "features", "finetune"]
    versus = versus_baselines(strategies)
    assert versus is not None and versus["outcome"] == "ties" and versus["stderr"] == 0.0
    same = {"popularity": strategy([0.5, 0.6]), "finetune": strategy([0.5, 0.6])}
    assert tied_with_best(same, "gauc") == ["finetune"]
    apart = versus_baselines({"popularity": strategy([0.5]), "finetune": strategy([0.6])})
    assert apart is not None and apart["outcome"] == "unknown"  # one micro-batch, a difference


@pytest.mark.parametrize(("learner", "named"), [
    (None, "the incremental DIN (finetune)"), ("din", "the incremental DIN (finetune)"),
    ("deepfm", "the incremental DeepFM (finetune)"),
    ("myteam.rates:GlobalRate", "the incremental myteam.rates:GlobalRate (finetune)"),
])
def test_the_verdict_names_the_learner_finetune_trained(learner: str | None, named: str) -> None:
    """``finetune`` trains ``STREAMREC_MODEL__LEARNER``'s learner: the verdict calls it by that name."""
    strategies = {"popularity": strategy([0.5, 0.52]), "finetune": strategy([0.5, 0.5])}
    model = {} if learner is None else {"learner": learner}
    report = {
        "strategies": strategies, "best": {"gauc": "popularity"}, "config": {"model": model},
        "versus_baselines": versus_baselines(strategies),
    }
    line = _verdict(report)
    assert f"; {named} ties with the best simple baseline" in line, line
