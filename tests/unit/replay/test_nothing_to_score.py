"""A backtest that would score nothing says why, in one line, instead of a table of blanks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from streamrec.cli import app
from streamrec.datasets.synthetic import ClickStreamSpec, generate_clicks
from streamrec.errors import StreamrecError
from streamrec.events import Event
from streamrec.replay.backtest import backtest
from tests.unit.replay.test_backtest import config

CLICKS = generate_clicks(ClickStreamSpec(events=300, users=20, items=100, seed=4))


def _write(path: Path, events: list[Event]) -> str:
    path.write_bytes(b"".join(e.to_json() + b"\n" for e in events))
    return str(path)


def _as(events: list[Event], action: str, label: int | None = None) -> list[Event]:
    return [Event(e.event_id, e.user_id, e.item_id, e.category_id, action, e.ts, label) for e in events]


def test_events_none_of_which_makes_a_sample_are_refused_with_the_reason(tmp_path: Path) -> None:
    source = _write(tmp_path / "e.jsonl", _as(CLICKS, "watched"))
    with pytest.raises(StreamrecError, match=r"none of the actions of the 300 events is in .*POSITIVE_ACTIONS"
                       r" \(pv, click\) and none has a label"):
        backtest(config(source=source, strategies=("popularity",)))


def test_samples_all_of_one_label_are_refused(tmp_path: Path) -> None:
    source = _write(tmp_path / "e.jsonl", _as(CLICKS, "click", label=1))
    with pytest.raises(StreamrecError, match=r"every one of the 300 samples is positive"):
        backtest(config(source=source, strategies=("popularity",)))


def test_no_strategy_is_refused() -> None:
    out = CliRunner().invoke(app, ["replay", "backtest", "synthetic:events=300", "--strategies", " , "])
    assert out.exit_code == 1 and out.output.startswith("error: --strategies"), out.output


def test_a_source_of_no_events_is_refused_as_the_demo_refuses_it(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(StreamrecError, match=rf"^{empty}: no events to replay or publish$"):
        backtest(config(source=str(empty), strategies=("popularity",)))


def _one_label_a_user(tmp_path: Path, users: int, run: int = 1) -> str:
    """``users`` users with one event each, labels alternating every ``run``: no user has a GAUC."""
    events = [
        Event(f"e{n}", f"u{n}", f"i{n % 7}", f"c{n % 3}", "click", 1_700_000_000_000 + n * 1_000,
              n // run % 2)
        for n in range(users)
    ]
    return _write(tmp_path / "one-each.jsonl", events)


def test_gauc_undefined_everywhere_says_why_and_names_the_best_auc(tmp_path: Path) -> None:
    source = _one_label_a_user(tmp_path, 40)
    out = CliRunner().invoke(app, [
        "replay", "backtest", source, "--strategies", "popularity,item-rate", "--batch-size", "10",
    ])
    assert out.exit_code == 0, out.output
    verdict = out.output.strip().splitlines()[-1]
    # it was "no strategy could be scored", under a table of AUCs the strategies were scored on
    assert "no strategy could be scored" not in out.output
    assert verdict.startswith("no GAUC: no user has both a positive and a negative sample in one micro-batch")
    assert re.search(r"best AUC: (popularity|item-rate) \(0\.\d{4}\)", verdict), verdict


def test_neither_figure_defined_says_so(tmp_path: Path) -> None:
    source = _one_label_a_user(tmp_path, 6, run=2)  # the last micro-batch of one joins the one before
    out = CliRunner().invoke(
        app, ["replay", "backtest", source, "--strategies", "popularity", "--batch-size", "1"]
    )
    assert out.exit_code == 0, out.output
    verdict = out.output.strip().splitlines()[-1]
    assert verdict.startswith("no GAUC:") and "no AUC either: no micro-batch holds both labels" in verdict
    assert "--batch-size" in verdict


def test_positives_with_no_negative_drawn_name_the_sampler_shortfall(tmp_path: Path) -> None:
    one = generate_clicks(ClickStreamSpec(events=30, users=1, items=60, categories=5, seed=4))
    source = _write(tmp_path / "one-user.jsonl", _as(one, "click"))
    # the sampler never draws a user's own items: one user's stream has no negative to draw
    with pytest.raises(StreamrecError, match=r"every one of the 30 samples is positive: .*the sampler could "
                       r"draw none of the 30 negatives asked"):
        backtest(config(source=source, strategies=("popularity",)))
