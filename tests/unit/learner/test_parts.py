"""What the parts of a micro-batch add up to in its one report (`streamrec.learner.parts`)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from streamrec.learner.base import TrainResult
from streamrec.learner.parts import MicroBatchParts, merge_results
from streamrec.learner.reports import StepResult
from streamrec.samples import Sample


def _sample(n: int) -> Sample:
    return Sample(f"e{n}", f"u{n % 3}", 1_700_000_000_000 + n, f"i{n}", "c1", n % 2, (), ())


def test_one_part_is_its_own_result() -> None:
    result = TrainResult(0.5, 3, 1, 0.1, ids_admitted={"item": 2}, samples=80)
    assert merge_results([result], [100]) is result


def test_losses_weigh_by_samples_trained_and_counts_add_up() -> None:
    first = TrainResult(0.6, 4, 0, 0.2, ids_admitted={"item": 3}, ids_evicted={"item": 1},
                        rows_in_use={"item": 10}, samples=100)
    second = TrainResult(0.3, 2, 1, 0.1, ids_admitted={"item": 1, "category": 2},
                         rows_in_use={"item": 12}, samples=50)
    merged = merge_results([first, second], [100, 80])
    assert merged.loss == pytest.approx((0.6 * 100 + 0.3 * 50) / 150)
    assert merged.penalty == pytest.approx((0.2 * 100 + 0.1 * 50) / 150)
    assert (merged.steps, merged.skipped_steps, merged.samples) == (6, 1, 150)
    assert merged.ids_admitted == {"item": 4, "category": 2}
    assert merged.ids_evicted == {"item": 1}
    assert merged.rows_in_use == {"item": 12}  # the last part's


def test_a_part_with_every_step_skipped_weighs_nothing_and_uncounted_ones_weigh_their_size() -> None:
    skipped = TrainResult(math.nan, 2, 2)
    uncounted = TrainResult(0.4, 1, 0)  # a learner that does not count trained samples
    merged = merge_results([skipped, uncounted, TrainResult(0.1, 1, 0)], [60, 30, 10])
    assert merged.loss == pytest.approx((0.4 * 30 + 0.1 * 10) / 40)
    assert merged.skipped_steps == 2
    assert math.isnan(merge_results([skipped, skipped], [1, 1]).loss)


def test_the_micro_batch_is_its_parts_in_order() -> None:
    parts = MicroBatchParts()
    for start, size in ((0, 3), (3, 2)):
        samples = [_sample(n) for n in range(start, start + size)]
        probs = np.arange(start, start + size) / 10
        step = StepResult(probs, np.zeros(size, bool), TrainResult(0.5, 1, 0, samples=size), 1.0, 2.0)
        parts.add([], samples, step, dead=1)
    parts.add([], [], None, dead=2)  # a part of dead letters only
    batch, step = parts.merged()
    assert batch.sample_ids == [f"e{n}" for n in range(5)]
    np.testing.assert_array_equal(step.probs, np.arange(5) / 10)
    assert (step.score_seconds, step.train_seconds, step.train.samples) == (2.0, 4.0, 5)
    assert parts.dead == 4
