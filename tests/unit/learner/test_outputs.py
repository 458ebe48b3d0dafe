"""A configured learner that breaks the contract at run time stops the run in one line.

The loop and the backtester use a learner's scores and training results as they come: a
user's class (``STREAMREC_MODEL__LEARNER``) returning scores of the wrong shape, NaN or
``None`` from ``learn_many`` failed deep in the metrics with a traceback, or (NaN) was scored
without a word. Noted by the model tour.
"""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from streamrec.cli import app
from streamrec.config import ModelConfig
from streamrec.errors import LearnerContractError
from streamrec.learner.base import TrainResult
from streamrec.learner.columns import SampleColumns
from streamrec.learner.outputs import checked_known, checked_result, checked_scores
from streamrec.replay.batches import MicroBatch
from streamrec.replay.strategies import Strategy, run_strategy
from streamrec.samples import Sample
from tests.unit.learner.tiny_learner import TinyLearner

LEARNER = "tests.unit.learner.test_outputs"


class Rate(TinyLearner):
    """A valid learner: every sample scores the positive rate so far."""


class Column(Rate):
    def predict_many(self, batch: SampleColumns) -> np.ndarray:
        return super().predict_many(batch)[:, None]


class NaNs(Rate):
    def predict_many(self, batch: SampleColumns) -> np.ndarray:
        return np.full(len(batch), np.nan)


class ReturnsNothing(Rate):
    def learn_many(self, batch: SampleColumns) -> TrainResult:
        super().learn_many(batch)
        return None  # type: ignore[return-value]  # the defect under test


def test_good_outputs_pass_unchanged() -> None:
    scores = np.array([0.0, 0.5, 1.0])
    assert checked_scores(scores, 3, "x") is scores
    assert checked_scores([0.5, 0.5], 2, "x").dtype == np.float64  # array-like: made float64
    known = np.array([True, False])
    assert checked_known(known, 2, "x") is known
    result = TrainResult(steps=1)
    assert checked_result(result, "x") is result


@pytest.mark.parametrize(("scores", "says"), [
    (np.zeros((3, 1)), "predict_many returned scores of shape (3, 1) for 3 samples; expected (3,)"),
    (np.zeros(2), "predict_many returned scores of shape (2,) for 3 samples; expected (3,)"),
    (np.array([0.5, np.nan, np.inf]), "predict_many returned 2 of 3 scores not finite"),
    (np.array([0.5, 1.5, -1.0]), "predict_many returned 2 of 3 scores outside [0, 1]"),
    (np.array(["a", "b", "c"]), "predict_many returned scores of dtype <U1; expected numbers"),
    (None, "predict_many returned NoneType; expected a numpy array of 3 scores"),
])
def test_bad_scores_are_named_in_one_line(scores: object, says: str) -> None:
    with pytest.raises(LearnerContractError) as err:
        checked_scores(scores, 3, "my.mod:Cls")
    assert str(err.value) == f"learner my.mod:Cls: {says}"


def test_the_live_loop_leaves_non_finite_scores_to_its_divergence_guard() -> None:
    scores = np.array([0.5, np.nan])
    assert checked_scores(scores, 2, "x", finite=False) is scores
    with pytest.raises(LearnerContractError, match="outside"):
        checked_scores(np.array([np.nan, 2.0]), 2, "x", finite=False)


def test_bad_known_and_results_are_named_in_one_line() -> None:
    with pytest.raises(LearnerContractError, match=r"^learner x: is_known returned int64 \(2,\) for 3 "):
        checked_known(np.zeros(2, dtype=int), 3, "x")
    with pytest.raises(LearnerContractError, match="^learner x: learn_many returned NoneType, not a "):
        checked_result(None, "x")


def _batches() -> list[MicroBatch]:
    return [
        MicroBatch(b, [Sample(f"s{b}-{k}", f"u{k % 3}", 1_700_000_000_000 + 10 * b + k, f"i{k % 4}", "c",
                              k % 2, (), ()) for k in range(8)])
        for b in range(2)
    ]


@pytest.mark.parametrize(("cls", "says"), [
    ("Column", "predict_many returned scores of shape ("),
    ("NaNs", "scores not finite"),
    ("ReturnsNothing", "learn_many returned NoneType, not a TrainResult"),
])
def test_the_backtester_stops_on_a_learner_that_breaks_the_contract(cls: str, says: str) -> None:
    strategy = Strategy("finetune", "finetune", ModelConfig(learner=f"{LEARNER}:{cls}"))
    run_strategy(Strategy("finetune", "finetune", ModelConfig(learner=f"{LEARNER}:Rate")), _batches())
    with pytest.raises(LearnerContractError, match=f"^learner {LEARNER}:{cls}: "):
        run_strategy(strategy, _batches())
    out = CliRunner().invoke(app, [
        "replay", "backtest", "synthetic:events=400,users=20,seed=1", "--batch-size", "100",
        "--strategies", "finetune,item-rate",
    ], env={"STREAMREC_MODEL__LEARNER": f"{LEARNER}:{cls}"})
    assert out.exit_code == 1, out.output
    assert f"error: learner {LEARNER}:{cls}: " in out.output and says in out.output
    assert "Traceback" not in out.output
