"""A backtest runs on every dataset format the readers take, and on the generator."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from streamrec.datasets.synthetic import ClickStreamSpec, generate_clicks
from streamrec.replay.backtest import backtest
from tests.conftest import MOVIELENS
from tests.unit.replay.test_backtest import config

CLICKS = generate_clicks(ClickStreamSpec(events=1500, users=100, items=600, seed=9))


def taobao_csv(tmp_path: Path) -> str:
    path = tmp_path / "UserBehavior.csv"
    # Taobao's ids are numbers: drop the generator's letter prefixes.
    rows = [(e.user_id[1:], e.item_id[1:], e.category_id[1:], e.action, str(e.ts // 1000)) for e in CLICKS]
    path.write_text("".join(",".join(row) + "\n" for row in rows))
    return str(path)


def ml100k(tmp_path: Path) -> str:
    rows = (f"{e.user_id[1:]}\t{e.item_id[1:]}\t{1 + n % 5}\t{e.ts // 1000}\n" for n, e in enumerate(CLICKS))
    (tmp_path / "u.data").write_text("".join(rows))
    genres = ["0"] * 19
    items = sorted({e.item_id[1:] for e in CLICKS})
    (tmp_path / "u.item").write_text("".join(f"{i}|film {i}|||x|" + "|".join(genres) + "\n" for i in items))
    return str(tmp_path / "u.data")


def jsonl(tmp_path: Path) -> str:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(e.to_json() + b"\n" for e in CLICKS))
    return str(path)


@pytest.mark.parametrize(
    "make",
    [taobao_csv, ml100k, jsonl, lambda _: str(MOVIELENS), lambda _: "synthetic:events=1500,seed=9"],
    ids=["taobao", "ml100k", "jsonl", "movielens", "synthetic"],
)
def test_a_backtest_runs_on_each_dataset(make: object, tmp_path: Path) -> None:
    source = make(tmp_path)  # type: ignore[operator]  # one of the callables above
    report = backtest(config(source=source, limit=1500, batch_size=300, strategies=("item-rate", "finetune")))
    # Explicit ratings give a sample each; ML-100K's ids are user-movie, so a generated user
    # clicking an item twice rates it once (the repeat is a duplicate or a conflict).
    assert report["dataset"]["events"] == 1500 and report["dataset"]["samples"] > 900
    assert 0 < report["dataset"]["positives"] < report["dataset"]["samples"]
    assert not math.isnan(report["strategies"]["finetune"]["gauc"])
