"""Fields of a JSONL file that no declared feature reads are said, not dropped without a word.

``streamrec produce my.jsonl`` publishes each event in the contract's wire form plus its
declared features: a recorded ``device`` or ``price`` not declared was left out of every
record, and a backtest of the file ignored it, without a word (found by the replay tour,
counting what reached the broker with another client). Now the read warns, naming each such
field and on how many events it was.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from streamrec.datasets import load_events
from streamrec.features import FeatureSchema, FeatureSpec


def _file(path: Path, **extra: object) -> Path:
    lines = [
        {"event_id": f"x{k}", "user_id": "u1", "item_id": "i1", "category_id": "c", "action": "click",
         "ts": 1_700_000_000_000 + k, "label": 1, **(extra if k < 3 else {})}
        for k in range(5)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_fields_no_feature_reads_are_named_with_their_counts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _file(tmp_path / "e.jsonl", device="ios", price=9.5)
    with caplog.at_level(logging.WARNING, logger="streamrec.datasets"):
        assert len(load_events(path)) == 5
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        f"{path}: fields no declared feature reads, so neither published nor replayed: device (3 of 5 "
        "events), price (3 of 5 events); declare them (STREAMREC_FEATURES) to keep them"
    ]


def test_a_declared_field_and_the_contracts_own_are_not_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _file(tmp_path / "e.jsonl", device="ios", price_cents=950)
    schema = FeatureSchema.of([FeatureSpec(name="device", role="context"),
                               FeatureSpec(name="price", kind="number", field="price_cents")])
    with caplog.at_level(logging.WARNING, logger="streamrec.datasets"):
        load_events(path, schema=schema)
        load_events(_file(tmp_path / "plain.jsonl"))
    assert caplog.records == []
