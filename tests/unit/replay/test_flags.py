"""The backtest's own flags are checked before any work: a one-line error naming the flag.

Through the settings' own bounds where a flag sets a model setting (learning rate, passes,
EWC's λ), not a copy of them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from streamrec.cli import app
from streamrec.errors import ConfigError
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
        # found by the replay tour (test first): each ran, exit 0, the flag silently dropped
        (["--interval", "1h", "--batch-size", "10"], "--batch-size"),
        (["--sweep", "--sweep-intervals", "1h", "--batch-size", "10"], "--batch-size"),
        (["--sweep", "--strategies", "popularity"], "--strategies"),
        (["--sweep", "--strategies", "finetune,static"], "--strategies"),
        # a strategy's own flag without that strategy: it ran, exit 0, the flag silently dropped
        (["--strategies", "popularity", "--ewc-lambda", "5"], "--ewc-lambda"),
        (["--strategies", "popularity,finetune", "--warmup", "0.5"], "--warmup"),
        (["--strategies", "static", "--retrain-every", "3"], "--retrain-every"),
        (["--sweep", "--warmup", "0.5"], "--warmup"),
        (["--sweep", "--strategies", "finetune", "--ewc-lambda", "1,10"], "--ewc-lambda"),
        # the dump was written, then replaced by the report or its table: exit 0, the samples lost
        (["--report", "r.json", "--dump-samples", "r.json"], "--dump-samples"),
        (["--report", "out/r.json", "--dump-samples", "out/../out/r.md"], "--dump-samples"),
        (["--report", "r.json", "--dump-samples", "r.png"], "--dump-samples"),
    ],
)
def test_a_bad_flag_is_refused_in_one_line_naming_it(args: list[str], flag: str) -> None:
    out = CliRunner().invoke(app, ["replay", "backtest", SOURCE, *args])
    assert out.exception is None or isinstance(out.exception, SystemExit), repr(out.exception)
    assert out.exit_code == 1 and out.output.startswith("error: ") and flag in out.output, out.output
    assert len(out.output.strip().splitlines()) == 1, out.output


@pytest.mark.parametrize(
    ("fields", "error", "words"),
    [
        # found by the Python-API tour (test first): 'nope' ran as a DIN under that name and
        # () returned a report of no strategies; only the CLI checked the names
        ({"strategies": ("nope",)}, ConfigError, "unknown strateg(ies) ['nope']"),
        ({"strategies": ()}, ConfigError, "--strategies names none"),
        # a string is a tuple of letters: "names 'n' twice"
        ({"strategies": "finetune"}, TypeError, "strategies must be a tuple of names, not 'finetune'"),
        ({"ablate": "genres"}, TypeError, "ablate must be a tuple of names, not 'genres'"),
        # a str: '>=' not supported; a float batch size was taken
        ({"jobs": "2"}, TypeError, "jobs must be an int, not '2'"),
        ({"batch_size": 2.5}, TypeError, "batch_size must be an int, not 2.5"),
        # found by the API tour (M): "'<=' not supported between instances of 'int' and 'str'", and
        # settings as a dict passed until backtest ran: "'dict' object has no attribute 'feature_schema'"
        ({"warmup": "0.5"}, TypeError, "warmup must be a number, not '0.5'"),
        ({"settings": {}}, TypeError, "settings must be a StreamrecConfig (load_config()), not dict"),
    ],
)
def test_a_backtest_config_made_in_python_is_checked_as_the_flags_are(
    fields: dict[str, Any], error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=re.escape(words)):
        bt.BacktestConfig(SOURCE, **fields)


def test_a_samples_dump_may_be_named_by_a_string(tmp_path: Path) -> None:
    # found by the Python-API tour: a str path failed after the whole replay ('str' has no with_name)
    path = tmp_path / "s.jsonl"
    assert bt.BacktestConfig(SOURCE, dump_samples=str(path)).dump_samples == path
    # typed so: a str from Python is no type error (it was typed Path only), nor an os.PathLike
    assert bt.BacktestConfig(SOURCE, dump_samples=_PathLike(str(path))).dump_samples == path


class _PathLike:
    def __init__(self, path: str) -> None:
        self.path = path

    def __fspath__(self) -> str:
        return self.path


NO_PATH = "BacktestConfig.dump_samples must be a path (a str or os.PathLike), not "


@pytest.mark.parametrize(("given", "error", "words"), [
    (5, TypeError, f"{NO_PATH}5"),
    (b"s.jsonl", TypeError, f"{NO_PATH}b's.jsonl'"),
    ("", ConfigError, "--dump-samples '': it is empty: name a path"),
])
def test_a_samples_dump_that_is_no_path_is_refused_at_once(
    given: Any, error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=re.escape(words)):
        bt.BacktestConfig(SOURCE, dump_samples=given)


def test_a_samples_dump_naming_a_directory_is_refused_at_once(tmp_path: Path) -> None:
    # from Python it failed after the whole replay (the CLI checks the flag before)
    with pytest.raises(ConfigError, match=re.escape(f"--dump-samples {str(tmp_path)!r} is a directory")):
        bt.BacktestConfig(SOURCE, dump_samples=tmp_path)
