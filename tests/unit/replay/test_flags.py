"""The backtest's own flags are checked before any work: a one-line error naming the flag.

Through the settings' own bounds where a flag sets a model setting (learning rate, passes,
EWC's λ), not a copy of them.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from streamrec.cli import app
from streamrec.replay import backtest as bt

SOURCE = "synthetic:events=300,users=20,items=100,seed=3"


@pytest.fixture(autouse=True)
def no_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading the events means the flags were let through: fail there."""

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("events read before the flags were checked")

    monkeypatch.setattr(bt, "load_events", refuse)


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--strategies", "retrain", "--retrain-every", "0"], "--retrain-every"),
        (["--retrain-every", "-2"], "--retrain-every"),
        (["--ewc-lambda", "abc"], "--ewc-lambda"),
        (["--ewc-lambda", "-1"], "--ewc-lambda"),
        (["--ewc-lambda", "0.1,-1"], "--ewc-lambda"),
        (["--sweep", "--sweep-lrs", "abc"], "--sweep-lrs"),
        (["--sweep", "--sweep-lrs", "-0.5"], "--sweep-lrs"),
        (["--sweep", "--sweep-lrs", "0"], "--sweep-lrs"),
        (["--sweep", "--sweep-passes", "0"], "--sweep-passes"),
        (["--sweep", "--sweep-passes", "x"], "--sweep-passes"),
        (["--sweep", "--sweep-intervals", "0m"], "--sweep-intervals"),
        (["--sweep", "--ablate", "all"], "--ablate"),
        # found by a tour (test first): the sweep ran, exit 0, and no file was written
        (["--sweep", "--dump-samples", "samples.jsonl"], "--dump-samples"),
        (["--limit", "-5"], "--limit"),
        (["--limit", "0"], "--limit"),
        (["--warmup", "2"], "--warmup"),
        (["--warmup", "-1"], "--warmup"),
        (["--jobs", "0"], "--jobs"),
        (["--jobs", "-3"], "--jobs"),
        (["--batch-size", "0"], "--batch-size"),
        (["--interval", "0m"], "--interval"),
    ],
)
def test_a_bad_flag_is_refused_in_one_line_naming_it(args: list[str], flag: str) -> None:
    out = CliRunner().invoke(app, ["replay", "backtest", SOURCE, *args])
    assert out.exception is None or isinstance(out.exception, SystemExit), repr(out.exception)
    assert out.exit_code == 1 and out.output.startswith("error: ") and flag in out.output, out.output
    assert len(out.output.strip().splitlines()) == 1, out.output
