"""The backtest says what the consumers' logic did not turn into samples, as the consumers do.

Dead letters (by reason, with examples), duplicates, late events and, in the ``join`` mode,
impressions whose windows were still open at the end of the file: counted in the report's
``dataset`` section and printed, never dropped without a word.
"""

from __future__ import annotations

import logging
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from streamrec.cli import app
from streamrec.config import StreamrecConfig
from streamrec.datasets.synthetic import ClickStreamSpec, generate_clicks
from streamrec.events import Event
from streamrec.replay.backtest import backtest
from streamrec.replay.batches import replay_events
from tests.unit.replay.test_backtest import TINY, config

CLICKS = generate_clicks(ClickStreamSpec(events=600, users=40, items=200, seed=5))


def _write(path: Path, events: list[Event]) -> str:
    path.write_bytes(b"".join(e.to_json() + b"\n" for e in events))
    return str(path)


def _reused(events: list[Event], n: int) -> list[Event]:
    """``n`` events again under ids already used, with another item: conflicting ids."""
    return [*events, *(Event(e.event_id, e.user_id, e.item_id + "x", e.category_id, e.action, e.ts)
                       for e in events[:n])]


def test_reused_ids_are_counted_as_dead_letters_with_their_reason(tmp_path: Path) -> None:
    source = _write(tmp_path / "e.jsonl", _reused(CLICKS, 50))
    report = backtest(config(source=source, strategies=("popularity",), batch_size=200))
    dataset = report["dataset"]
    assert dataset["events"] == 650
    dead = dataset["dead_letters"]
    assert dead["count"] == 50
    [(reason, count)] = dead["by_reason"].items()
    assert count == 50 and "reused with other content" in reason
    assert 0 < len(dead["examples"]) <= 3
    assert all("reused with other content" in e["reason"] for e in dead["examples"])
    assert dataset["duplicates"] == 0


def test_resent_events_are_counted_as_duplicates(tmp_path: Path) -> None:
    source = _write(tmp_path / "e.jsonl", [*CLICKS, *CLICKS[:40]])
    dataset = backtest(config(source=source, strategies=("popularity",), batch_size=200))["dataset"]
    assert dataset["duplicates"] == 40 and dataset["dead_letters"]["count"] == 0


def test_the_cli_prints_what_was_not_replayed(tmp_path: Path) -> None:
    source = _write(tmp_path / "e.jsonl", _reused(CLICKS, 50))
    out = CliRunner().invoke(app, [
        "replay", "backtest", source, "--strategies", "popularity", "--batch-size", "200",
        "--report", str(tmp_path / "r.json"),
    ])
    assert out.exit_code == 0, out.output
    assert "50 dead-lettered" in out.output and "reused with other content" in out.output
    assert orjson.loads((tmp_path / "r.json").read_bytes())["dataset"]["dead_letters"]["count"] == 50


def test_impressions_still_open_at_the_end_are_counted_as_undecided() -> None:
    settings = StreamrecConfig.model_validate({
        "model": TINY, "consumer": {"labels": "join", "allowed_lateness_ms": 0, "label_window_ms": 60_000},
    })
    t = 1_700_000_000_000
    events = [
        Event("a", "u1", "i1", "c1", "impression", t),  # closed by the last event: a negative
        Event("b", "u1", "i2", "c1", "impression", t + 100_000),
        Event("c", "u1", "i2", "c1", "click", t + 110_000),  # b's click: a positive
        Event("d", "u2", "i3", "c1", "impression", t + 150_000),  # still open at the end
        Event("e", "u2", "i4", "c1", "impression", t + 160_000),  # still open at the end
    ]
    replayed = replay_events(events, settings)
    assert replayed.undecided == 2
    assert sorted((s.sample_id, s.label) for s in replayed.samples) == [("a", 0), ("b", 1)]


def test_a_declared_feature_no_event_carries_is_counted_and_warned_of(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by a tour: a feature declared as ``price`` (or with a mistyped ``field``) that no
    event carries read its default everywhere, and the backtest said nothing.
    """
    source = _write(tmp_path / "e.jsonl", CLICKS)
    settings = StreamrecConfig.model_validate({
        "model": TINY,
        "features": [{"name": "price", "kind": "number"}, {"name": "shop", "field": "shop_id"}],
    })
    cfg = config(source=source, strategies=("popularity",), batch_size=200, settings=settings)
    with caplog.at_level(logging.WARNING, logger="streamrec.replay"):
        report = backtest(cfg)
    assert report["dataset"]["features"] == {
        "price": {"field": "price", "events": 0}, "shop": {"field": "shop_id", "events": 0},
    }
    assert "feature 'shop' (field 'shop_id') is in none of the 600 events" in caplog.text
