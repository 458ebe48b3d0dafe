"""The MovieLens example's user features reach every sample, as of its time (the rater's history)."""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

from streamrec.cli.common import build_config
from streamrec.replay.backtest import BacktestConfig, samples_of, seeded
from tests.conftest import MOVIELENS, ROOT

EXAMPLE = ROOT / "examples" / "movielens" / "streamrec.toml"
LIMIT = 6_000  # the earliest ratings: users rating dozens within one consumer batch of 2,000


def _earlier_counts(path: Path) -> dict[tuple[str, int], int]:
    """(user, time in ms) -> the user's ratings at earlier seconds, from the raw file."""
    times: dict[str, list[int]] = defaultdict(list)
    with (path / "ratings.csv").open() as f:
        for row in csv.DictReader(f):
            times[row["userId"]].append(int(row["timestamp"]) * 1000)
    return {(user, t): sum(1 for s in ts if s < t) for user, ts in times.items() for t in ts}


def test_every_sample_carries_the_raters_count_as_of_its_time() -> None:
    settings = build_config(quiet=True, config_file=EXAMPLE)
    cfg = BacktestConfig(source=str(MOVIELENS), limit=LIMIT, settings=settings)
    _, samples = samples_of(cfg, seeded(cfg, cfg.schema), cfg.schema)
    counts = _earlier_counts(MOVIELENS)
    missing = [s.sample_id for s in samples if "user_ratings" not in s.features]
    assert not missing, f"{len(missing)} of {len(samples)} samples without user_ratings, e.g. {missing[:3]}"
    wrong = [s.sample_id for s in samples if s.features["user_ratings"] != counts[(s.user_id, s.ts)]]
    assert not wrong, f"{len(wrong)} samples with another count, e.g. {wrong[:3]}"
