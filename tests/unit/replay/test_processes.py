"""``--jobs N``: the strategies in processes of their own give the runs one process gives."""

from __future__ import annotations

import numpy as np
import pytest

from streamrec.replay import backtest as bt
from streamrec.replay.processes import run_in_processes
from streamrec.replay.strategies import Strategy
from tests.conftest import MOVIELENS


@pytest.fixture(scope="module")
def setup() -> tuple[list[Strategy], list[bt.MicroBatch]]:
    cfg = bt.BacktestConfig(
        source=str(MOVIELENS), limit=6_000, batch_size=1_000, strategies=("popularity", "finetune")
    )
    settings = bt.seeded(cfg, cfg.schema)
    _, batches = bt.micro_batches(cfg, settings, cfg.schema)
    return list(bt.strategies_of(cfg, settings, cfg.schema)), list(batches)


def test_runs_in_processes_are_the_runs_in_one(setup: tuple[list[Strategy], list[bt.MicroBatch]]) -> None:
    strategies, batches = setup
    done: list[str] = []
    apart = run_in_processes(strategies, batches, 2, lambda name, *_: done.append(name))
    alone = bt.run_all(strategies, batches, 1, None)
    names = [s.name for s in strategies]
    assert [r.name for r in apart] == names and sorted(done) == sorted(names)
    for one, other in zip(apart, alone, strict=True):
        for a, b in zip(one.scores, other.scores, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_strategys_error_reaches_the_command(setup: tuple[list[Strategy], list[bt.MicroBatch]]) -> None:
    strategies, batches = setup
    with pytest.raises(AttributeError, match="has no attribute 'samples'"):  # raised in the process
        run_in_processes(strategies[:1], [*batches, "not a micro-batch"], 1, None)  # type: ignore[list-item]
