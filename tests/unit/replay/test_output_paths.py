"""The backtest's output paths are checked before any replaying: a one-line error, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from streamrec.cli import app
from streamrec.cli import replay as cli_replay
from streamrec.errors import OutputError
from streamrec.replay import backtest as bt
from streamrec.replay.dump import dump_samples

SOURCE = "synthetic:events=300,users=20,items=100,seed=3"
REPLAY = bt.backtest  # the real one, for a run that fails on its own


def _run(*args: str) -> tuple[int, str]:
    strategies = [] if "--strategies" in args else ["--strategies", "popularity"]
    out = CliRunner().invoke(app, ["replay", "backtest", SOURCE, *strategies, *args])
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


def _unwritable(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir.json").mkdir()
    return {
        "under-a-file": str(tmp_path / "afile" / "x.json"),
        "a-directory": str(tmp_path / "adir.json"),
        "proc": "/proc/x.json",
    }


@pytest.mark.parametrize("flag", ["--report", "--dump-samples"])
@pytest.mark.parametrize("case", ["under-a-file", "a-directory", "proc"])  # empty: test_empty_paths
def test_an_output_that_cannot_be_written_is_refused_first(tmp_path: Path, flag: str, case: str) -> None:
    code, output = _run(flag, _unwritable(tmp_path)[case])
    assert code == 1 and output.startswith("error: ") and flag in output, output
    assert len(output.strip().splitlines()) == 1, output


def test_a_write_that_fails_at_the_end_is_our_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # cli_errors makes a StreamrecError one line; an OSError would be a traceback
    def full(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("streamrec.fileio.write_atomic", full)
    with pytest.raises(OutputError, match=r"r.json could not be written: No space left on device"):
        cli_replay._write(tmp_path / "r.json", b"{}", "", None)
    monkeypatch.setattr(Path, "open", full)
    with pytest.raises(OutputError, match=r"s.jsonl: No space left on device"):
        dump_samples([], tmp_path / "s.jsonl")


@pytest.mark.parametrize("flag", ["--report", "--dump-samples"])
def test_a_run_that_fails_leaves_no_folder_made_for_its_outputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flag: str
) -> None:
    """Found by a tour: the output's folders were made when the flags were checked, so a run
    that failed left them behind, empty; they are made when the file is written.
    """
    monkeypatch.setattr(bt, "backtest", REPLAY)
    out = tmp_path / "new" / "sub" / "r.json"
    result = CliRunner().invoke(app, ["replay", "backtest", "synthetic:events=0", flag, str(out)])
    assert result.exit_code == 1 and "events must be a positive integer" in result.output, result.output
    assert not (tmp_path / "new").exists()


def test_a_sweep_report_leaves_no_other_runs_table_or_plot_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the replay tour: a sweep wrote its JSON over a backtest's report and left the
    backtest's .md and .png beside it, the table and plot of another run under its name.
    """
    monkeypatch.setattr(bt, "sweep", lambda *_, **__: {"sweep": []})
    report = tmp_path / "r.json"
    for suffix in (".json", ".md", ".png"):
        report.with_suffix(suffix).write_text("the backtest before")
    code, output = _run("--sweep", "--strategies", "finetune", "--report", str(report))
    assert code == 0, output
    assert report.with_suffix(".md").read_text().startswith("| micro-batches | learning rate |")
    assert not report.with_suffix(".png").exists()
