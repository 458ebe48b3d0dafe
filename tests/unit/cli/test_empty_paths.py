"""An empty path is refused wherever a path is given, never read as the working directory.

`Path('')` is `Path('.')`: ``--snapshot-dir ''`` (a script's variable left unset) listed the
working directory as a snapshot directory ("no snapshots in ."), ``STREAMREC_LEARNER__SNAPSHOT_DIR=``
did the same, and ``up --data-dir ''`` kept Redis's data in the working directory. A flag or
argument is a usage error naming it, as any other bad value is; a setting is the settings' one line.
Earlier tours found ``--report ''`` read as the working directory and ``generate ''`` a traceback.
"""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from streamrec.cli import app

EMPTY = "it is empty: name a path ('.' for the working directory)"

#: Every path a command takes (flag or argument), given as ''.
GIVEN = [
    (["snapshot", "list", "--snapshot-dir", ""], "'--snapshot-dir'"),
    (["snapshot", "list", "--config", ""], "'--config'"),
    (["snapshot", "materialize", "1", ""], "'OUT'"),
    (["learner", "run", "--snapshot-dir", ""], "'--snapshot-dir'"),
    (["serve", "--snapshot-dir", ""], "'--snapshot-dir'"),
    (["snapshot", "canary", "--snapshot-dir", ""], "'--snapshot-dir'"),
    (["status", "--state-dir", ""], "'--state-dir'"),
    (["up", "--data-dir", ""], "'--data-dir'"),
    (["demo", "--snapshot-dir", ""], "'--snapshot-dir'"),
    (["generate", ""], "'OUT'"),
    (["replay", "backtest", "synthetic:events=10", "--report", ""], "'--report'"),
    (["replay", "backtest", "synthetic:events=10", "--dump-samples", ""], "'--dump-samples'"),
]


def _flat(output: str) -> str:
    """Typer's error box as one line of words."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", output).split())


@pytest.mark.parametrize(("args", "named"), GIVEN, ids=[" ".join(a) for a, _ in GIVEN])
def test_an_empty_path_given_is_a_usage_error_naming_it(args: list[str], named: str) -> None:
    result = CliRunner().invoke(app, args)
    said = _flat(result.output)
    assert result.exit_code == 2 and f"Invalid value for {named}" in said and EMPTY in said, result.output


@pytest.mark.parametrize(
    ("env", "args"),
    [
        ("STREAMREC_LEARNER__SNAPSHOT_DIR", ["snapshot", "list"]),
        ("STREAMREC_SERVICES__STATE_DIR", ["status"]),
        ("STREAMREC_SERVICES__DATA_DIR", ["status"]),
    ],
)
def test_an_empty_path_setting_is_refused_in_one_line(env: str, args: list[str]) -> None:
    result = CliRunner().invoke(app, args, env={env: ""})
    assert result.exit_code == 1, result.output
    assert result.output == f"error: invalid setting {env} (from the environment or its flag): {EMPTY}\n"
