"""A user's learner that raises in a backtest is named, and its own frames are shown.

An exception inside ``learn_many`` (or ``predict_many``) of a class given as
``STREAMREC_MODEL__LEARNER`` came out of ``replay backtest`` as a raw traceback of some forty
frames, Typer's and the backtester's around the user's two; under ``--jobs`` the user's frames
were lost with the process. Now it is one line naming the learner, the method, the strategy and
the micro-batch, then the user's own frames (it is their code to fix), and from Python a
`LearnerFailed` chained to the user's exception. Noted by the replay tours.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from streamrec.cli import app
from streamrec.cli.common import cli_errors
from streamrec.config import ModelConfig
from streamrec.errors import LearnerFailed, StreamrecError
from streamrec.learner.base import TrainResult
from streamrec.learner.columns import SampleColumns
from streamrec.replay.batches import MicroBatch
from streamrec.replay.strategies import Strategy, run_strategy
from streamrec.samples import Sample
from tests.unit.learner.tiny_learner import TinyLearner

HERE = "tests.unit.replay.test_learner_raises"


class LearnsOnce(TinyLearner):
    """Learns its first micro-batch; its second call fails, two frames deep in its own code."""

    def learn_many(self, batch: SampleColumns) -> TrainResult:
        if self.counts[1]:
            return self._update(batch)
        return super().learn_many(batch)

    def _update(self, batch: SampleColumns) -> TrainResult:
        raise ValueError("the user's own bug")


class CannotScore(TinyLearner):
    def predict_many(self, batch: SampleColumns) -> np.ndarray:
        raise KeyError("missing table")


def _batches() -> list[MicroBatch]:
    return [
        MicroBatch(b, [Sample(f"s{b}-{k}", f"u{k % 3}", 1_700_000_000_000 + 10 * b + k, f"i{k % 4}", "c",
                              k % 2, (), ()) for k in range(8)])
        for b in range(3)
    ]


def test_learn_many_raising_is_named_with_the_users_frames() -> None:
    strategy = Strategy("finetune", "finetune", ModelConfig(learner=f"{HERE}:LearnsOnce"))
    with pytest.raises(LearnerFailed) as err:
        run_strategy(strategy, _batches())
    assert str(err.value) == (
        f"learner {HERE}:LearnsOnce: learn_many raised ValueError: the user's own bug "
        "(strategy finetune, micro-batch 2 of 3)"
    )
    assert isinstance(err.value, StreamrecError)
    assert isinstance(err.value.__cause__, ValueError)  # chained: Python callers keep it whole
    frames = err.value.frames
    assert frames.startswith("Traceback (most recent call last):\n")
    assert "in learn_many" in frames and "in _update" in frames and "test_learner_raises.py" in frames
    assert frames.rstrip().endswith("ValueError: the user's own bug")
    assert "strategies.py" not in frames  # the user's frames, not the backtester's
    # a strategy's process (--jobs) sends it back pickled: the frames travel as text
    again = pickle.loads(pickle.dumps(err.value))
    assert str(again) == str(err.value) and again.frames == frames


def test_predict_many_raising_is_named_too() -> None:
    strategy = Strategy("finetune", "finetune", ModelConfig(learner=f"{HERE}:CannotScore"))
    with pytest.raises(LearnerFailed, match=rf"^learner {HERE}:CannotScore: predict_many raised KeyError: "
                       r"'missing table' \(strategy finetune, micro-batch 1 of 3\)$"):
        run_strategy(strategy, _batches())


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_the_cli_says_one_line_then_the_users_frames(jobs: str) -> None:
    out = CliRunner().invoke(app, [
        "replay", "backtest", "synthetic:events=400,users=20,seed=1", "--batch-size", "100",
        "--strategies", "finetune,item-rate", "--jobs", jobs,
    ], env={"STREAMREC_MODEL__LEARNER": f"{HERE}:LearnsOnce"})
    assert out.exit_code == 1, out.output
    lines = out.output.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("error:"))
    assert lines[first] == (
        f"error: learner {HERE}:LearnsOnce: learn_many raised ValueError: the user's own bug "
        "(strategy finetune, micro-batch 2 of 4)"
    )
    rest = "\n".join(lines[first + 1:])
    assert rest.startswith("Traceback (most recent call last):")
    assert "in _update" in rest and rest.rstrip().endswith("ValueError: the user's own bug")
    for theirs in ("typer", "click", "strategies.py", "backtest.py"):  # none of the machinery's frames
        assert theirs not in rest



def test_a_class_path_is_printed_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    """``boom:Boom:`` held the emoji code ``:boom:``: the console printed 💥 in its place."""
    with pytest.raises(typer.Exit):
        with cli_errors():
            raise LearnerFailed("learner boom:Boom: learn_many raised ValueError: x (here)", "")
    assert capsys.readouterr().err == "error: learner boom:Boom: learn_many raised ValueError: x (here)\n"
