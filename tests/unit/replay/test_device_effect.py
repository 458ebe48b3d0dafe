"""A context feature with a known effect lifts the DIN in a backtest, and only while declared.

The generated stream redraws 90% of the events' categories from their session's device's own
(`streamrec.datasets.synthetic`), on short histories (four events a user) that cannot tell the
device themselves: the device is the signal. The ablation reruns the same samples without it.
"""

from __future__ import annotations

from streamrec.config import ModelConfig, StreamrecConfig
from streamrec.features import FeatureSpec
from streamrec.replay.backtest import BacktestConfig, backtest

DEVICE = FeatureSpec(name="device", role="context")
# Small and quick to learn: ~220 optimiser steps in all, a few seconds on one core.
MODEL = ModelConfig.model_validate({
    "sequence_length": 10, "mlp_units": (32,), "train_batch_size": 64, "learning_rate": 0.05, "device": "cpu",
})


def test_the_din_gains_from_a_declared_device_and_loses_it_without() -> None:
    cfg = BacktestConfig(
        source="synthetic:events=8000,users=2000,items=300,categories=6,device_effect=0.9",
        strategies=("item-rate", "finetune"), batch_size=1_000,
        settings=StreamrecConfig(features=(DEVICE,), model=MODEL), ablate=("all",),
    )
    runs = backtest(cfg)["ablation"]["strategies"]
    din = runs["finetune"]
    assert din["with"]["gauc"] > din["without"]["device"]["gauc"] + 0.03  # measured: 0.685 against 0.625
    counter = runs["item-rate"]  # reads no features: the same figures either way
    assert counter["with"]["gauc"] == counter["without"]["device"]["gauc"]
