"""The backtest report's tells: each match feature alone, once per backtest."""

from __future__ import annotations

from streamrec.replay.batches import by_count
from streamrec.replay.report import tells, tells_table
from tests.unit.learner.test_tells import samples


def test_a_planted_tell_reads_one_and_honest_samples_one_half() -> None:
    planted = tells(by_count(samples(True, n=2000), 500))
    assert planted["target_in_history"]["auc"] == 1.0 and planted["target_in_history"]["gauc_first_q"] == 1.0
    honest = tells(by_count(samples(False, n=2000), 500))
    assert abs(honest["target_in_history"]["auc"] - 0.5) < 0.05
    assert abs(honest["category_share"]["auc"] - 0.5) < 0.05
    table = tells_table({"tells": planted})
    assert "| target_in_history | 1.0000 |" in table and table.count("\n") == 1 + len(planted)
