"""``streamrec produce --positive-rating`` is held to what it can mean, in one line, exit 1.

It was taken without a word where it did nothing or made every label one value: on a JSONL,
Taobao or generated source (no ratings: the flag was ignored), and on MovieLens at ``nan`` or
above 5 (``rating >= nan`` is false: every event published as a negative). Found on the
front-door tour, 2026-12-07. The broker port has none behind it: the input is refused first.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from streamrec.cli import app

NO_BROKER = ["--bootstrap-servers", "127.0.0.1:1"]
JSONL = (
    '{"event_id": "e-1", "user_id": "42", "item_id": "1", "category_id": "7", "action": "pv", '
    '"ts": 1700000000000}\n'
)
RATINGS = "userId,movieId,rating,timestamp\n1,31,2.5,1260759144\n1,1029,4.0,1260759179\n"


def _said(args: list[str]) -> tuple[int, str]:
    out = CliRunner().invoke(app, ["produce", *args, *NO_BROKER])
    return out.exit_code, " ".join(out.output.split())


@pytest.mark.parametrize("source", ["events.jsonl", "synthetic:events=10"])
def test_a_rating_threshold_without_ratings_is_refused(tmp_path: Path, source: str) -> None:
    if source.endswith(".jsonl"):
        (tmp_path / source).write_text(JSONL)
        source = str(tmp_path / source)
    code, said = _said([source, "--positive-rating", "3"])
    assert code == 1, said
    assert "error: --positive-rating is for MovieLens and ML-100K ratings" in said, said


@pytest.mark.parametrize("value", ["nan", "inf", "0", "5.5", "-1"])
def test_a_threshold_off_the_rating_scale_is_refused(tmp_path: Path, value: str) -> None:
    (tmp_path / "ratings.csv").write_text(RATINGS)
    code, said = _said([str(tmp_path / "ratings.csv"), "--positive-rating", value])
    assert code == 1, said
    assert "error: --positive-rating must be on the rating scale, above 0 and at most 5" in said, said


@pytest.mark.parametrize("extra", [[], ["--positive-rating", "3.5"]])
def test_ratings_with_or_without_the_flag_reach_the_broker(tmp_path: Path, extra: list[str]) -> None:
    (tmp_path / "ratings.csv").write_text(RATINGS)
    code, said = _said([str(tmp_path / "ratings.csv"), *extra])
    assert code == 1 and "unreachable" in said, said  # read and accepted; only the broker is missing
