"""Prequential: no strategy's scores of a micro-batch read its labels, or any later micro-batch's.

Every micro-batch from the fourth on has its labels flipped; the scores of the first four must
not move by a bit, for every strategy, while the fifth's do move for those that learn.
"""

from __future__ import annotations

import importlib.util

import msgspec
import numpy as np
import pytest

from streamrec.replay.backtest import micro_batches, seeded, strategies_of
from streamrec.replay.batches import MicroBatch
from streamrec.replay.strategies import KINDS, run_strategy
from tests.unit.replay.test_backtest import config

FLIPPED_FROM = 3  # the micro-batch whose labels, and every later one's, are flipped
KINDS_HERE = tuple(k for k in KINDS if k != "vw" or importlib.util.find_spec("vowpalwabbit"))


def _flipped(batch: MicroBatch) -> MicroBatch:
    return MicroBatch(batch.index, [msgspec.structs.replace(s, label=1 - s.label) for s in batch.samples])


@pytest.mark.parametrize("kind", KINDS_HERE)
def test_a_micro_batch_is_scored_before_its_labels_or_later_ones_are_read(kind: str) -> None:
    cfg = config(strategies=(kind,), warmup=0.5, retrain_every=2)
    settings = seeded(cfg, cfg.schema)
    _, batches = micro_batches(cfg, settings, cfg.schema)
    assert len(batches) > FLIPPED_FROM + 1
    changed = [*batches[:FLIPPED_FROM], *(_flipped(b) for b in batches[FLIPPED_FROM:])]
    (strategy,) = strategies_of(cfg, settings, cfg.schema)
    true, other = run_strategy(strategy, batches), run_strategy(strategy, changed)
    for index in range(FLIPPED_FROM + 1):  # the flipped micro-batch itself too: scored before it is learnt
        np.testing.assert_array_equal(true.scores[index], other.scores[index], err_msg=f"{kind}, {index}")
    # and the flip reaches the next micro-batch's scores: the comparison can see a leak
    assert not np.array_equal(true.scores[FLIPPED_FROM + 1], other.scores[FLIPPED_FROM + 1]), kind
