"""The learner benchmark counts the model's FLOPs from its shapes, by the docstring's formula."""

from __future__ import annotations

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
