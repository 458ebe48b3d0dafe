"""The learner benchmark: its FLOP count by the docstring's formula, its ceilings, and its whole run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from streamrec.config import ModelConfig
from streamrec.learner.model import DIN
from tests.support import small_tables

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from learner_throughput import (  # noqa: E402  (bench/ is a folder of scripts)
    attention_products,
    forward_flops,
    matmul_ceiling,
    products_floor,
)


def test_forward_flops_follow_the_formula() -> None:
    cfg = ModelConfig.model_validate(
        {
            "tables": small_tables(64, 16, dim=4),
            "attention_units": (6, 3),
            "mlp_units": (5,),
            "sequence_length": 7,
            "device": "cpu",
        }
    )
    model = DIN(cfg)
    d = 8  # two behaviour tables of width 4
    attention = 2 * (4 * d * 6 + 6 * 3 + 3 * 1)
    head_in = 3 * d + sum(f.width for f in model.x_head) + model.dense_dim + model.match.width  # type: ignore[union-attr]
    head = 2 * (head_in * 5 + 5 * 1)
    assert forward_flops(model, 7) == 7 * attention + head + 2 * (2 * 7 * d)


def test_the_matmul_ceiling_is_a_rate() -> None:
    model = DIN(ModelConfig.model_validate({"tables": small_tables(64, 16, dim=4), "device": "cpu"}))
    assert matmul_ceiling(model, rows=64, seconds=0.05) > 1e6


def test_the_attention_products_are_the_models_and_the_floor_a_rate() -> None:
    cfg = ModelConfig.model_validate(
        {
            "tables": small_tables(64, 16, dim=4),
            "attention_units": (6, 3),
            "sequence_length": 7,
            "train_batch_size": 5,
            "device": "cpu",
        }
    )
    model = DIN(cfg)
    forward = [((5, 7, 9), (5, 9, 6)), ((35, 6), (6, 3))]  # keys 8 wide and the ones column
    backward = [((5, 7, 6), (5, 6, 9)), ((5, 9, 7), (5, 7, 6)), ((6, 35), (35, 3)), ((35, 3), (3, 6))]
    assert attention_products(model, cfg) == [*forward, *forward, *backward]
    assert products_floor(model, cfg, "numpy", rounds=2) > 0
    assert products_floor(model, cfg, "paddle", rounds=2) > 0


def test_the_benchmark_runs_its_loops_end_to_end_and_prints_its_figures() -> None:
    # The script's own main loop, micro-batches in parts included, on the bundled MovieLens:
    # the benchmark writes the runner's per-part step out by hand, so a drift shows here.
    bench = Path(__file__).resolve().parents[3] / "bench" / "learner_throughput.py"
    done = subprocess.run(
        [sys.executable, str(bench), "--samples", "15000", "--parts", "2"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert (figures["bench"], figures["samples"], figures["parts"]) == ("learner_throughput", 15000, 2)
    assert figures["streamrec_samples_per_cpu_s"] > 0 and figures["bare_loop_samples_per_cpu_s"] > 0
    assert 0.6 < figures["mean_progressive_auc_after_10k"] < 1.0  # scored before training, and it learnt
