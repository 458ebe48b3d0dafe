"""A backtest under a declared schema: the data's fields reach the samples the strategies see.

These check the whole path (reader or generator -> events -> the consumers' sample builder ->
micro-batches -> ablation); in a build whose events cannot carry declared features they check
the one-line error instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from streamrec.config import StreamrecConfig
from streamrec.datasets.synthetic import DEVICES
from streamrec.features import FeatureSpec
from streamrec.replay.backtest import BacktestConfig, backtest

DEVICE = FeatureSpec(name="device", role="context")
MOVIELENS = (
    FeatureSpec(name="genres", kind="ids", max_ids=10),
    FeatureSpec(name="year", kind="number", transform="standardize"),
    FeatureSpec(name="rating", kind="number", outcome=True),
)


def dumped(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line)["sample"] for line in path.read_bytes().splitlines()]


def test_a_generated_device_reaches_every_sample_and_is_ablated(tmp_path: Path) -> None:
    cfg = BacktestConfig(
        source="synthetic:events=800,users=40,items=300,device_effect=0.5",
        strategies=("popularity", "item-rate"), batch_size=200, dump_samples=tmp_path / "s.jsonl",
        settings=StreamrecConfig(features=(DEVICE,)), ablate=("all",),
    )
    report = backtest(cfg)
    samples = dumped(tmp_path / "s.jsonl")
    assert all(s["features"]["device"] in DEVICES for s in samples)  # positives and their negatives
    assert report["config"]["features"] == [DEVICE.meaning()]
    assert report["ablation"]["features"] == ["device"]
    assert set(report["ablation"]["strategies"]) == {"popularity", "item-rate"}


def test_movielens_ratings_ride_along_the_history_never_on_the_target(
    tmp_path: Path, movielens_path: Path
) -> None:
    cfg = BacktestConfig(
        source=str(movielens_path), limit=2_000, strategies=("popularity",), batch_size=500,
        dump_samples=tmp_path / "s.jsonl", settings=StreamrecConfig(features=MOVIELENS),
    )
    backtest(cfg)
    samples = dumped(tmp_path / "s.jsonl")
    assert all("rating" not in s.get("features", {}) for s in samples)  # the label's own value
    with_history = [s for s in samples if s["seq_items"]]
    assert with_history
    for s in with_history:
        ratings = s["seq_features"]["rating"]
        assert len(ratings) == len(s["seq_items"]) and all(0.5 <= r <= 5.0 for r in ratings)
    assert any("genres" in s.get("features", {}) for s in samples)
