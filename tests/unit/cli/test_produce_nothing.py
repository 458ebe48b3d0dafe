"""Publishing a file of no events, or a format with the generator, is one line and exit 1.

``streamrec produce empty.jsonl`` (and ``replay publish``) exited 0 having sent nothing: a
script took an empty export for a published one. ``--format`` with ``synthetic:...`` was
ignored without a word. Neither contacts the broker: the port given has none behind it.
Noted by earlier tours.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from streamrec.cli import app
from streamrec.datasets import load_events
from streamrec.errors import ConfigError

NO_BROKER = ["--bootstrap-servers", "127.0.0.1:1"]  # never reached: the input is refused first
PUBLISHERS = [["produce"], ["replay", "publish"]]


def _said(args: list[str]) -> tuple[int, str]:
    out = CliRunner().invoke(app, args)
    return out.exit_code, " ".join(out.output.split())


@pytest.mark.parametrize("command", PUBLISHERS)
@pytest.mark.parametrize(("name", "text"), [
    ("empty.jsonl", ""),
    ("blank.jsonl", "\n  \n\r\n"),
    ("ratings.csv", "userId,movieId,rating,timestamp\n"),  # the header alone
])
def test_a_file_of_no_events_is_refused(tmp_path: Path, command: list[str], name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    code, said = _said([*command, str(path), *NO_BROKER])
    assert code == 1, said
    assert f"error: {path}: no events to replay or publish" in said, said
    assert "published" not in said


@pytest.mark.parametrize("command", PUBLISHERS)
def test_a_limit_of_none_is_refused(tmp_path: Path, command: list[str]) -> None:
    code, said = _said([*command, "synthetic:events=10", "--limit", "0", *NO_BROKER])
    assert code == 1 and "error: synthetic:events=10: --limit 0 leaves no events to replay or publish" in said


@pytest.mark.parametrize("command", [*PUBLISHERS, ["replay", "backtest"]])
def test_a_format_with_the_generator_is_refused(command: list[str]) -> None:
    broker = NO_BROKER if command != ["replay", "backtest"] else []
    code, said = _said([*command, "synthetic:events=10", "--format", "taobao", *broker])
    assert code == 1, said
    assert "error: --format taobao is for a file: synthetic:events=10 is generated; leave --format out" \
        in said


def test_load_events_refuses_them_too() -> None:
    with pytest.raises(ConfigError, match="^--format jsonl is for a file: synthetic is generated"):
        load_events("synthetic", "jsonl")
    assert len(load_events("synthetic:events=5", "auto")) == 5


def test_replay_publish_says_how_long_it_will_take_in_a_readable_unit(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    # found by the replay tour: MovieLens at 60x was "over 11449811 s" (133 days, unsaid)
    monkeypatch.setattr("streamrec.kafka.topics.ensure_topics", lambda *_: None)
    monkeypatch.setattr("streamrec.producer.publish", lambda events, *_, **__: len(events))
    thirty_days = 30 * 86_400_000  # at 60x: up to 12 hours
    out = CliRunner().invoke(app, ["replay", "publish", f"synthetic:events=200,duration_ms={thirty_days}",
                                   *NO_BROKER])
    assert out.exit_code == 0, out.output
    assert re.search(r"publishing 200 events over \d+(\.\d)?h \(60x event time\)", out.output), out.output
