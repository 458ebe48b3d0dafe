"""The backtest's output paths are checked before any replaying: a one-line error, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from streamrec.cli import app
from streamrec.replay import backtest as bt

SOURCE = "synthetic:events=300,users=20,items=100,seed=3"


def _run(*args: str) -> tuple[int, str]:
    out = CliRunner().invoke(app, ["replay", "backtest", SOURCE, "--strategies", "popularity", *args])
    assert out.exception is None or isinstance(out.exception, SystemExit), out.exception
    return out.exit_code, out.output


@pytest.fixture(autouse=True)
def no_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    """A check that comes after the replay fails here instead of passing late."""

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("replayed before the flags were checked")

    monkeypatch.setattr(bt, "backtest", refuse)
    monkeypatch.setattr(bt, "sweep", refuse)


@pytest.mark.parametrize("suffix", [".md", ".png", ".txt", ""])
def test_a_report_not_named_json_is_refused(tmp_path: Path, suffix: str) -> None:
    # the .md and .png are written beside the JSON, by its name: x.md would be overwritten
    report = tmp_path / f"x{suffix}"
    code, output = _run("--report", str(report))
    assert code == 1 and "--report" in output and ".json" in output, output
    assert len(output.strip().splitlines()) == 1 and not report.exists()
