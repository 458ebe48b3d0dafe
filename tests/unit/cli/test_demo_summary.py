"""The demo's summary: figures over the last three quarters of the micro-batches it can judge
a model by. Before, a last micro-batch of 4 samples (AUC nan) counted as one of them.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

from streamrec.cli import app
from streamrec.cli.demo import _summary
from streamrec.learner.metrics import MicroBatchMetrics
from streamrec.learner.runner import LearnerStats, MicroBatchReport


def report(index: int, samples: int, score: float) -> MicroBatchReport:
    labels = np.arange(samples) % 2
    probs = np.where(labels == 1, score, 1 - score)  # AUC 1 (score > 0.5) or 0
    metrics = MicroBatchMetrics.compute(labels, probs, np.array(["u"] * samples), np.zeros(samples))
    return MicroBatchReport(index, metrics, 0, 0, 0.5, 0.1, 0.1, min_eval_samples=100)


def test_micro_batches_too_small_to_judge_are_named_and_left_out(
    capsys: pytest.CaptureFixture[str],
) -> None:
    reports = [report(k, 1000, 0.9) for k in range(1, 5)] + [report(5, 4, 0.1)]
    assert [r.judged for r in reports] == [True] * 4 + [False]
    result = SimpleNamespace(
        published=1, consumer=SimpleNamespace(events=1, samples=4004, dead=0),
        learner=LearnerStats(5, 4004), snapshots=[], served=None,
    )
    _summary(result, reports)  # type: ignore[arg-type]  # what the summary reads of a result
    out = capsys.readouterr().out
    assert "too small to judge" in out and "1 (4 samples)" in out
    auc_row = next(line for line in out.splitlines() if "progressive AUC" in line)
    assert "1.0000" in auc_row  # the 4-sample micro-batch (AUC 0) left out of the quarters
    assert "target in history alone" in out and "category share alone" in out  # the sampler's tells


@pytest.mark.parametrize("limit", ["0", "-2"])
def test_a_demo_of_no_events_is_refused_in_one_line(limit: str) -> None:
    """Noted by a tour: ``demo --limit 0`` started the services, ran a demo of nothing and
    exited 0. As the backtest does, a demo refuses a limit that leaves it no events.
    """
    result = CliRunner().invoke(app, ["demo", "--limit", limit])
    assert result.exit_code == 1, result.output
    assert result.output == f"error: --limit must be a positive number of events, not {limit}\n"
