"""The ablation: a declared feature removed from the same samples and from the learner's schema."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from streamrec.cli import app
from streamrec.config import StreamrecConfig
from streamrec.errors import ConfigError
from streamrec.features import FeatureSchema, FeatureSpec
from streamrec.replay import ablation
from streamrec.replay import backtest as bt
from streamrec.replay.batches import MicroBatch
from streamrec.replay.strategies import Progress, Strategy, StrategyRun
from streamrec.samples import Sample

SIGNAL = FeatureSpec(name="signal", kind="number", role="context")
HISTORY = FeatureSpec(name="genres", kind="ids")
NOISE = FeatureSpec(name="device", role="context")
SCHEMA = FeatureSchema.of([SIGNAL, HISTORY, NOISE])
T0 = 1_700_000_000_000


def sample(n: int, label: int) -> Sample:
    return Sample(
        f"e{n}", f"u{n % 5}", T0 + n, f"i{n}", "c1", label, ("i0", "i1"), ("c0", "c1"),
        features={"signal": float(label), "device": "ios", "genres": ("a", "b")},
        seq_features={"genres": (("a",), None)},
    )


BATCHES = [MicroBatch(k, [sample(10 * k + n, n % 2) for n in range(10)]) for k in range(4)]


def test_strip_removes_a_feature_from_the_target_and_the_sequence() -> None:
    s = BATCHES[0].samples[1]
    stripped = ablation.strip(s, {"genres"})
    assert stripped.features == {"signal": 1.0, "device": "ios"} and stripped.seq_features == {}
    assert (stripped.item_id, stripped.label, stripped.seq_items) == (s.item_id, s.label, s.seq_items)
    assert Sample.from_json(stripped.to_json()) == stripped  # still a valid sample on the wire
    assert ablation.strip(s, {"year"}) is s  # nothing to strip: the very same sample
    everything = ablation.strip(s, {"genres", "signal", "device"})
    assert everything.to_json() == Sample(*[getattr(s, f) for f in Sample.__struct_fields__[:8]]).to_json()
    batches = ablation.strip_batches(BATCHES, {"signal"})
    assert [b.index for b in batches] == [0, 1, 2, 3]
    assert all("signal" not in x.features and "device" in x.features for b in batches for x in b.samples)
    assert all("signal" in x.features for b in BATCHES for x in b.samples)  # the originals untouched


def test_the_reduced_schema_keeps_the_others_in_order() -> None:
    assert ablation.without(SCHEMA, {"genres"}).names == ("item", "category", "signal", "device")
    assert ablation.without(SCHEMA, set()) == SCHEMA


def test_which_features_are_ablated() -> None:
    assert ablation.ablated([], SCHEMA) == ()
    assert ablation.ablated(["all"], SCHEMA) == ("signal", "genres", "device")
    assert ablation.ablated(["device", "signal", "device"], SCHEMA) == ("device", "signal")
    with pytest.raises(ConfigError, match=r"--ablate: year not declared; the declared features: signal, gen"):
        ablation.ablated(["year"], SCHEMA)
    with pytest.raises(ConfigError, match="--ablate: category not declared"):
        ablation.ablated(["category"], SCHEMA)  # the model's own, not a declared one
    with pytest.raises(ConfigError, match="none is declared"):
        ablation.ablated(["all"], FeatureSchema.default())


def _signal(s: Sample) -> float:
    value = s.features.get("signal", 0.5)
    assert isinstance(value, float)
    return value


class FakeRuns:
    """run_all with a strategy that scores each sample by its ``signal`` feature (0.5 without)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[Strategy], Sequence[MicroBatch]]] = []

    def __call__(
        self,
        strategies: Sequence[Strategy],
        batches: Sequence[MicroBatch],
        jobs: int,
        on_progress: Progress | None,
    ) -> list[StrategyRun]:
        self.calls.append((list(strategies), batches))
        scores = [np.array([_signal(s) for s in b.samples]) for b in batches]
        return [StrategyRun(s.name, s.kind, scores=scores) for s in strategies]


@pytest.fixture
def ablated_report(monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], FakeRuns]:
    runs = FakeRuns()
    monkeypatch.setattr(bt, "run_all", runs)
    settings = StreamrecConfig(features=(SIGNAL, HISTORY, NOISE))
    cfg = bt.BacktestConfig(source="unused", strategies=("popularity", "finetune"), settings=settings)
    full = {r.name: bt.summarise(r, BATCHES) for r in runs(bt.strategies_of(cfg, settings), BATCHES, 1, None)}
    runs.calls.clear()
    return bt.ablate(cfg, cfg.schema, BATCHES, full, ("signal", "device")), runs


def test_each_feature_is_removed_from_the_samples_and_the_learners_schema(
    ablated_report: tuple[dict[str, Any], FakeRuns],
) -> None:
    _, runs = ablated_report
    assert len(runs.calls) == 2  # once per feature, every strategy
    for (strategies, batches), removed in zip(runs.calls, ("signal", "device"), strict=True):
        assert [s.name for s in strategies] == [f"popularity −{removed}", f"finetune −{removed}"]
        assert all(removed not in s.schema and "genres" in s.schema for s in strategies)
        assert [len(b.samples) for b in batches] == [len(b.samples) for b in BATCHES]  # the same samples
        assert all(removed not in x.features for b in batches for x in b.samples)


def test_the_report_shows_each_feature_with_and_without(
    ablated_report: tuple[dict[str, Any], FakeRuns],
) -> None:
    section, _ = ablated_report
    assert section["features"] == ["signal", "device"]
    assert set(section["strategies"]) == {"popularity", "finetune"}
    figures = section["strategies"]["finetune"]
    assert set(figures) == {"with", "without"}
    assert set(figures["with"]) == {"auc", "gauc", "auc_first_q", "gauc_first_q"}
    # the fake strategy ranks by the signal: perfect with it, no better than chance without it,
    # and the device it never reads changes nothing
    assert figures["with"]["gauc"] == pytest.approx(1.0)
    assert figures["without"]["signal"]["gauc"] == pytest.approx(0.5)
    assert figures["without"]["signal"]["gauc_first_q"] == pytest.approx(0.5)
    assert figures["without"]["device"] == figures["with"]
    table = ablation.table({"ablation": section}).splitlines()
    assert table[0] == (
        "| strategy | GAUC | GAUC −signal | GAUC −device | GAUC first 1/4 | first 1/4 −signal "
        "| first 1/4 −device |"
    )
    assert table[3] == (
        "| finetune | 1.0000 | 0.5000 (-0.5000) | 1.0000 (+0.0000) | 1.0000 | 0.5000 (-0.5000) "
        "| 1.0000 (+0.0000) |"
    )
    assert ablation.table({}) == ""


def test_ablating_with_nothing_declared_fails_before_any_work(tmp_path: Any) -> None:
    cfg = bt.BacktestConfig(source=str(tmp_path / "missing.jsonl"), ablate=("all",))
    with pytest.raises(ConfigError, match="none is declared"):
        bt.backtest(cfg)  # not the missing file's error: the names are checked first
    result = CliRunner().invoke(app, ["replay", "backtest", "synthetic:events=50", "--ablate", "year"])
    assert result.exit_code == 1
    assert "none is declared" in result.output
