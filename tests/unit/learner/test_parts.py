"""What the parts of a micro-batch add up to in its one report (`streamrec.learner.parts`)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from streamrec.kafka.records import Partition, Record
from streamrec.learner.base import TrainResult
from streamrec.learner.columns import SampleColumns
from streamrec.learner.parts import MicroBatchParts, merge_results
from streamrec.learner.reports import StepResult
from streamrec.learner.scored import Scored
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
        batch = SampleColumns.from_samples([_sample(n) for n in range(start, start + size)])
        probs = np.arange(start, start + size) / 10
        step = StepResult(probs, np.zeros(size, bool), TrainResult(0.5, 1, 0, samples=size), 1.0, 2.0)
        parts.add([], step, dead=1, batch=batch)
    parts.add([], None, dead=2)  # a part of dead letters only
    scored, step = parts.merged()
    assert scored.ts.tolist() == [_sample(n).ts for n in range(5)]
    np.testing.assert_array_equal(step.probs, np.arange(5) / 10)
    np.testing.assert_array_equal(scored.probs, np.arange(5) / 10)
    assert (step.score_seconds, step.train_seconds, step.train.samples) == (2.0, 4.0, 5)
    assert parts.dead == 4


def test_the_parts_scores_are_those_of_the_whole_micro_batch() -> None:
    # Each part's scores are taken from its own columns (its match features by positions
    # along its own sequences); together they are the whole micro-batch's, field by field.
    rng = np.random.default_rng(7)
    samples = [
        Sample(
            f"e{n}", f"u{n % 4}", 1_700_000_000_000 + n, f"i{rng.integers(6)}", f"c{rng.integers(3)}",
            n % 2, tuple(f"i{k}" for k in rng.integers(6, size=n % 5)),
            tuple(f"c{k}" for k in rng.integers(3, size=n % 5)),
        )
        for n in range(40)
    ]
    probs, known = rng.random(40), rng.random(40) < 0.5
    whole = Scored.of(SampleColumns.from_samples(samples), probs, known)
    parts = MicroBatchParts()
    for a, b in ((0, 13), (13, 14), (14, 40)):
        step = StepResult(probs[a:b], known[a:b], TrainResult(0.5, 1, 0, samples=b - a), 0.0, 0.0)
        parts.add([], step, dead=0, batch=SampleColumns.from_samples(samples[a:b]))
    scored, _ = parts.merged()
    assert any(v.any() for v in whole.features.values())  # some behaviours match their targets
    for name in ("label", "probs", "users", "known", "ts", "served"):
        np.testing.assert_array_equal(getattr(scored, name), getattr(whole, name), err_msg=name)
    assert scored.features.keys() == whole.features.keys()
    for name, values in whole.features.items():
        np.testing.assert_array_equal(scored.features[name], values, err_msg=name)


def test_a_step_without_its_columns_is_refused() -> None:
    step = StepResult(np.zeros(1), np.zeros(1, bool), TrainResult(0.5, 1, 0, samples=1), 0.0, 0.0)
    with pytest.raises(ValueError, match="columns"):
        MicroBatchParts().add([], step, dead=0)


def test_the_parts_keep_where_their_records_end_not_the_records() -> None:
    # The positions past a micro-batch's records are all its close needs of them: the parts
    # keep those, so a backlog's micro-batch does not hold every raw record until its close.
    parts = MicroBatchParts()
    assert not parts.begun
    parts.add([_record(0, 4), _record(1, 9)], None, dead=2)
    parts.add([_record(0, 5), _record(2, 3)], None, dead=2)
    assert parts.begun
    assert parts.ends == {Partition("samples", 0): 6, Partition("samples", 1): 10, Partition("samples", 2): 4}


def _record(partition: int, offset: int) -> Record:
    return Record(b"{}", offset, topic="samples", partition=partition)
