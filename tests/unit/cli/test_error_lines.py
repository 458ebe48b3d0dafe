"""Every CLI error is one line in one style: ``error: ...`` first, what helps after it.

Flags the parser refused (a missing argument, a value of the wrong type, an unknown command or
option) came as a box titled ``Error`` (``Error: ...`` where Typer draws no boxes), the
command's own refusals as ``error: ...``: a script grepping for one missed the other. Parse
errors keep their exit status 2 (a command line that cannot run), the commands' 1. Noted by
earlier tours.
"""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from streamrec.cli import app
from streamrec.cli.common import cli_errors


@pytest.mark.parametrize(("args", "says", "helps"), [
    (["produce"], "error: Missing argument 'source'", "produce"),
    (["produce", "x.jsonl", "--rate", "abc"], "error: Invalid value for '--rate'", "produce"),
    (["produce", "x.jsonl", "--no-such-flag"], "error: No such option: --no-such-flag", "produce"),
    (["produce", "x.jsonl", "--format"], "error: Option '--format' requires an argument", "produce"),
    (["replay", "publish", "x", "--speedup"], "error: Option '--speedup' requires an argument",
     "replay publish"),
    (["no-such-command"], "error: No such command 'no-such-command'", ""),
    (["replay", "no-such-command"], "error: No such command 'no-such-command'", "replay"),
    (["replay", "backtest", "x", "--jobs", "many"], "error: Invalid value for '--jobs'", "replay backtest"),
])
def test_a_refused_command_line_is_one_error_line_then_how_to_get_help(
    args: list[str], says: str, helps: str
) -> None:
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 2, out.output
    lines = out.output.strip().splitlines()
    assert lines[0].startswith(says), out.output
    assert not lines[0].endswith("."), lines[0]  # as ours: no full stop
    assert lines[-1] == f"Try '{' '.join(['root', *helps.split()])} --help' for help.", out.output
    assert "Error" not in out.output and "╭" not in out.output and "│" not in out.output


def test_a_commands_own_refusal_is_in_the_same_style() -> None:
    out = CliRunner().invoke(app, ["replay", "backtest", "x", "--jobs", "0"])
    assert out.exit_code == 1
    assert out.output.strip().splitlines() == ["error: --jobs must be at least 1, not 0"]


@pytest.mark.parametrize("args", [[], ["replay"], ["--help"], ["produce", "--help"]])
def test_help_is_shown_as_before(args: list[str]) -> None:
    out = CliRunner().invoke(app, args)
    assert "Usage:" in out.output and "error" not in out.output.lower().split("usage:")[0]
    assert out.exit_code == (0 if args and args[-1] == "--help" else 2)


@pytest.mark.parametrize("notes", [[], ["3 of the 3 events sent were delivered"]])
def test_an_interrupt_says_what_its_notes_say(capsys: pytest.CaptureFixture[str], notes: list[str]) -> None:
    # a publish stopped by Ctrl-C notes what was delivered (integration test_producer)
    stop = KeyboardInterrupt()
    for note in notes:
        stop.add_note(note)
    with pytest.raises(typer.Exit) as left:
        with cli_errors():
            raise stop
    assert left.value.exit_code == 130
    assert capsys.readouterr().err == "interrupted" + "".join(f": {n}" for n in notes) + "\n"
