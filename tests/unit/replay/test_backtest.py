"""The backtester: every strategy on the same micro-batches, deterministic, documented report.

Small generated streams and a tiny DIN keep these fast on two cores.
"""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from streamrec.cli import app
from streamrec.config import StreamrecConfig
from streamrec.errors import ConfigError
from streamrec.replay import strategies as strategies_module
from streamrec.replay.backtest import BacktestConfig, backtest, micro_batches, seeded, sweep
from streamrec.replay.report import TIMINGS, markdown_table, plot, sweep_table, to_json
from streamrec.replay.strategies import DEFAULT_KINDS, Strategy, run_strategy
from tests.support import small_tables

SOURCE = "synthetic:events=4000,users=200,items=1500,seed=3"
TINY = {
    "tables": small_tables(2**12, 2**8, dim=8), "attention_units": (8,), "mlp_units": (16,),
    "sequence_length": 10, "device": "cpu",
}


def config(**kw: Any) -> BacktestConfig:
    settings = StreamrecConfig.model_validate({"model": TINY})
    return BacktestConfig(**{
        "source": SOURCE, "batch_size": 500, "settings": settings, "ewc_lambdas": (100.0,), **kw
    })


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return backtest(config())


def test_every_strategy_is_scored_on_the_same_samples(report: dict[str, Any]) -> None:
    strategies = report["strategies"]
    assert list(strategies) == list(DEFAULT_KINDS)
    sizes = report["micro_batches"]["samples"]
    assert sum(sizes) == report["dataset"]["samples"] and report["micro_batches"]["count"] == len(sizes)
    for name, s in strategies.items():
        assert s["series"]["samples"] == sizes, name
        for metric in ("auc", "gauc", "logloss", "backward_auc", "forgetting", "train_seconds"):
            assert isinstance(s[metric], float) and not math.isnan(s[metric]), (name, metric)
    assert 0 < strategies["ewc"]["penalty_share"] < 1 and strategies["finetune"]["penalty_share"] == 0
    assert strategies["ewc"]["gauc"] != strategies["finetune"]["gauc"]
    assert math.isnan(strategies["popularity"]["penalty_share"])  # trains no weights
    assert strategies["popularity"]["train_seconds"] < strategies["retrain"]["train_seconds"]
    assert report["best"]["gauc"] in strategies
    quarter = max(1, len(sizes) // 4)
    first = strategies["features"]["series"]["gauc"][:quarter]
    expected = sum(g * n for g, n in zip(first, sizes, strict=False)) / sum(sizes[:quarter])
    assert strategies["features"]["gauc_first_q"] == pytest.approx(expected)
    assert strategies["features"]["series"]["gauc"][0] == 0.5  # scored before any training
    assert set(report["tells"]) == {"target_in_history", "category_share", "category_hit", "empty_history"}


def test_the_same_seed_gives_the_same_report(report: dict[str, Any]) -> None:
    again = backtest(config())
    assert again["digest"] == report["digest"]
    hashes = {hashlib.sha256(to_json(_without(r, TIMINGS | {"digest"}))).hexdigest() for r in (report, again)}
    assert len(hashes) == 1  # byte for byte, but for wall-clock seconds
    other = backtest(config(seed=1, strategies=("finetune",)))
    assert other["digest"] != report["digest"]


def _without(value: Any, keys: frozenset[str]) -> Any:
    if isinstance(value, dict):
        return {k: _without(v, keys) for k, v in value.items() if k not in keys}
    return [_without(v, keys) for v in value] if isinstance(value, list) else value


def test_static_trains_only_on_the_warmup_and_retrain_starts_over(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = config()
    settings = seeded(cfg)
    _, batches = micro_batches(cfg, settings)
    made: list[str] = []
    trained: list[tuple[str, int]] = []
    make = Strategy.make_learner

    def counting(self: Strategy) -> Any:
        made.append(self.kind)
        learner = make(self)
        learn = learner.learn_many

        def learn_many(batch: Any) -> Any:
            trained.append((self.kind, len(batch)))
            return learn(batch)

        learner.learn_many = learn_many  # type: ignore[method-assign]  # counting what it trains on
        return learner

    monkeypatch.setattr(strategies_module.Strategy, "make_learner", counting)
    static = Strategy("static", "static", settings.model, warmup=0.25)
    run_strategy(static, batches)
    warmup = batches[: round(0.25 * len(batches))]
    assert [n for kind, n in trained if kind == "static"] == [len(b.samples) for b in warmup]
    retrain = Strategy("retrain", "retrain", settings.model, retrain_every=3)
    run_strategy(retrain, batches)
    assert made.count("retrain") == 1 + len(batches) // 3
    last_retrain = batches[: 3 * (len(batches) // 3)]
    assert max(n for kind, n in trained if kind == "retrain") == sum(len(b.samples) for b in last_retrain)


def test_the_report_has_its_documented_outputs(report: dict[str, Any], tmp_path: Path) -> None:
    doc = orjson.loads(to_json(report))
    assert doc["schema"] == 1
    assert set(doc) >= {"dataset", "config", "micro_batches", "strategies", "best", "digest", "wall_seconds"}
    assert doc["config"]["batch_size"] == 500 and doc["config"]["model"]["sequence_length"] == 10
    table = markdown_table(report)
    assert table.count("\n") == len(DEFAULT_KINDS) + 1 and "| ewc | " in table
    plot(report, tmp_path / "gauc.png")
    assert (tmp_path / "gauc.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_by_interval_and_a_sweep(tmp_path: Path) -> None:
    hourly = backtest(config(interval_ms=3_600_000, strategies=("popularity",)))
    assert hourly["config"]["interval_ms"] == 3_600_000 and hourly["micro_batches"]["count"] > 10
    swept = sweep(config(strategies=("finetune", "ewc")), [None, 6 * 3_600_000], [1e-3, 3e-3], [1, 2])
    rows = swept["sweep"]
    # noted by a tour: the sweep's JSON held the rows alone, not what they were measured on
    assert swept["dataset"] == {**hourly["dataset"]} and swept["config"]["model"] == hourly["config"]["model"]
    assert [(r["interval_ms"], r["learning_rate"], r["passes"], r["strategy"]) for r in rows] == [
        (i, lr, n, kind)
        for i in (None, 6 * 3_600_000) for lr in (1e-3, 3e-3) for n in (1, 2) for kind in ("finetune", "ewc")
    ]
    assert all((r["penalty_share"] > 0) == (r["strategy"] == "ewc") for r in rows)
    assert "| 2 | ewc λ=100 |" in sweep_table(rows)
    # found by the replay tour: --strategies finetune swept ewc too (the named strategies were ignored)
    alone = sweep(config(strategies=("ewc",)), [None], [1e-3], [1])["sweep"]
    assert [r["strategy"] for r in alone] == ["ewc"]


def test_a_sweep_of_settings_the_learner_does_not_read_is_refused() -> None:
    """Found by the model tour.

    With a class built without from_config, --sweep-lrs and --sweep-passes ran rows that
    differed in name only.
    """
    blind = StreamrecConfig.model_validate(
        {"model": {**TINY, "learner": "tests.unit.learner.tiny_learner:SettingsBlindLearner"}}
    )
    cfg = config(strategies=("finetune", "ewc"), settings=blind)
    for lrs, passes in (([1e-3, 3e-3], [1]), ([1e-3], [1, 2])):
        with pytest.raises(ConfigError, match=r"SettingsBlindLearner.* reads no model settings \(no from_"):
            sweep(cfg, [None], lrs, passes)
    rows = sweep(cfg, [None, 6 * 3_600_000], [1e-3], [1])["sweep"]  # intervals: rows of their own
    assert [r["interval_ms"] for r in rows] == [None, None, 6 * 3_600_000, 6 * 3_600_000]


def test_the_cli_prints_the_table_and_writes_json_markdown_and_png(tmp_path: Path) -> None:
    out = CliRunner().invoke(app, [
        "replay", "backtest", SOURCE, "--batch-size", "800", "--strategies", "popularity,item-rate",
        "--report", str(tmp_path / "r.json"),
    ])
    assert out.exit_code == 0, out.output
    assert "| popularity |" in out.output and "best GAUC:" in out.output
    assert "| target_in_history |" in out.output and "| category_share |" in out.output
    assert orjson.loads((tmp_path / "r.json").read_bytes())["schema"] == 1
    assert (tmp_path / "r.md").exists() and (tmp_path / "r.png").exists()
    bad = CliRunner().invoke(app, ["replay", "backtest", SOURCE, "--strategies", "magic"])
    assert bad.exit_code == 1 and "unknown strateg" in bad.output


def test_the_report_measures_the_cold_start_slices_with_and_without_fallback(
    report: dict[str, Any],
) -> None:
    cold = report["cold_start"]
    for name in ("new_items", "new_users"):
        assert cold[name]["samples"] > 0, name
        for strategy in report["strategies"]:
            figures = cold[name][strategy]
            want = {"auc", "gauc", "auc_fallback", "gauc_fallback", "batch_auc", "batch_auc_fallback"}
            assert set(figures) >= want
            assert 0.0 <= figures["batch_auc_fallback"] <= 1.0
    # item-rate scores every new item by the global rate, one value: no ranking among them
    # (AUC 0.5 on the slice); the fallback's prior is each new item's category's rate, which does.
    items = cold["new_items"]["item-rate"]
    assert items["auc"] == pytest.approx(0.5)
    assert items["auc_fallback"] != pytest.approx(0.5)
    # A new user's fallback is the popular ranking: the popularity strategy's own scores.
    users = cold["new_users"]["popularity"]
    assert users["auc_fallback"] == pytest.approx(users["auc"])
    assert cold["new_users"]["finetune"]["auc_fallback"] == pytest.approx(users["auc"])


def test_the_docs_schema_names_every_field_of_the_report(report: dict[str, Any]) -> None:
    # docs/backtesting.md's schema block: each section's line(s) name its fields
    text = (Path(__file__).resolve().parents[3] / "docs" / "backtesting.md").read_text()
    block = text.split("    schema, wall_seconds, digest", 1)[1].split("```", 1)[0]
    words = set(re.findall(r"[a-z_0-9]+", block))
    strategy = next(iter(report["strategies"].values()))
    cold = report["cold_start"]["new_items"]
    named = [*report, *report["dataset"], *report["dataset"]["dead_letters"], *strategy,
             *strategy["series"], *cold["finetune"], *report["cold_start"]]
    assert sorted(set(named) - words - {"schema", "wall_seconds", "digest"}) == []  # the first line
    # auc and gauc are sample-weighted means of the micro-batches' figures; the pooled ones are apart
    assert "auc, gauc, logloss                   (prequential, every micro-batch pooled)" not in block


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--strategies", "popularity,item-rate,popularity"], "--strategies names 'popularity' twice"),
        (["--strategies", "ewc", "--ewc-lambda", "0.1,1,0.10"], "--ewc-lambda names 0.1 twice"),
        (["--strategies", "ewc", "--ewc-lambda", "0,0"], "--ewc-lambda names 0.0 twice"),
        (["--ablate", "genres,genres"], "--ablate names 'genres' twice"),
        (["--sweep", "--sweep-lrs", "0.001,0.001"], "--sweep-lrs names 0.001 twice"),
    ],
    ids=str,
)
def test_a_strategy_lambda_ablation_or_swept_value_named_twice_is_refused(args: list[str], says: str) -> None:
    """Found from outside: ``--strategies popularity,item-rate,popularity`` ran popularity twice
    and reported one row of it (the report is keyed by name), without a word.
    """
    result = CliRunner().invoke(app, ["replay", "backtest", SOURCE, *args])
    assert result.exit_code == 1 and result.output.startswith("error: "), result.output
    assert says in " ".join(result.output.split()), result.output
