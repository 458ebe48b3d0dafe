"""A micro-batch's scores as records: what each rank all-gathers so that rank 0 reports and
gates the group's micro-batch as one process would.

The collectives themselves run across processes in ``tests/integration/learner/test_ranks.py``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, replace

import numpy as np
import pytest

from streamrec.learner.base import TrainResult
from streamrec.learner.columns import SampleColumns
from streamrec.learner.ranks import RankShare, pack
from streamrec.learner.reports import StepResult, scored_report
from streamrec.learner.scored import RECORD, Scored, gather_scores, totals
from streamrec.samples import Sample
from tests.unit.learner.test_tells import samples


def scored_samples(n: int = 400, seed: int = 0) -> tuple[list[Sample], np.ndarray, np.ndarray]:
    """Samples with honest match features, scores that rank them somewhat, some items known."""
    found = samples(planted=False, n=n, seed=seed)
    rng = np.random.default_rng(seed)
    label = np.array([s.label for s in found], np.float64)
    probs = np.clip(0.3 * label + rng.random(n) * 0.7, 0.0, 1.0)
    return found, probs, rng.random(n) < 0.6


def two_ranks(
    halves: list[Scored], trains: list[TrainResult], dead: list[int]
) -> list[tuple[Scored, TrainResult, int]]:
    """`gather_scores` on each of two ranks, the collective answered with both ranks' arrays."""
    sent = [
        pack({"scored": s.to_words(), "totals": totals(t, d)})
        for s, t, d in zip(halves, trains, dead, strict=True)
    ]

    def on(rank: int) -> tuple[Scored, TrainResult, int]:
        def gather(array: np.ndarray, what: str) -> list[np.ndarray]:
            np.testing.assert_array_equal(array, sent[rank])  # one collective: its own arrays
            return sent

        exchange = RankShare(rank, 2, gather=gather).exchange
        return gather_scores(exchange, halves[rank], trains[rank], dead[rank])

    return [on(0), on(1)]


def test_a_record_is_five_words_a_sample_and_reads_back_as_the_scores() -> None:
    found, probs, known = scored_samples(50)
    b = SampleColumns.from_samples(found)
    served = np.linspace(0, 1, 50)
    scored = Scored.of(b, probs, known, served)
    words = scored.to_words()
    assert RECORD.itemsize == 40 and words.dtype == np.int64 and len(words) == 5 * 50
    back = Scored.from_words(words)
    np.testing.assert_array_equal(back.label, b.label)
    np.testing.assert_array_equal(back.probs, probs.astype(np.float32))
    np.testing.assert_array_equal(back.served, served.astype(np.float32))
    np.testing.assert_array_equal(back.known, known)
    np.testing.assert_array_equal(back.ts, b.ts)
    for name, values in scored.features.items():
        np.testing.assert_array_equal(back.features[name], values.astype(np.float32), err_msg=name)
    assert back.users.dtype == np.uint64 and len(np.unique(back.users)) == len(np.unique(b.user_ids))
    assert np.isnan(Scored.of(b, probs, known).served).all()  # no judgement due: not scored


def test_two_ranks_gathered_report_the_metrics_loss_and_counts_of_the_whole_micro_batch() -> None:
    found, probs, known = scored_samples(400)
    b = SampleColumns.from_samples(found)
    whole = Scored.of(b, probs, known)
    cut = 150
    halves = [
        Scored.of(SampleColumns.from_samples(found[:cut]), probs[:cut], known[:cut]),
        Scored.of(SampleColumns.from_samples(found[cut:]), probs[cut:], known[cut:]),
    ]
    trains = [TrainResult(0.5, 7, 0, samples=cut), TrainResult(0.7, 7, 0, samples=400 - cut)]
    alone = StepResult(probs, known, TrainResult(0.625, 7, 0, samples=400), 1.0, 2.0)
    one = scored_report(3, whole, alone, 3, 1)
    for scored, train, dead in two_ranks(halves, trains, [1, 2]):
        assert len(scored) == 400 and dead == 3 and train.samples == 400 and train.steps == 7
        report = scored_report(3, scored, StepResult(probs, known, train, 1.0, 2.0), dead, 1)
        assert report.loss == pytest.approx(0.5 * 150 / 400 + 0.7 * 250 / 400)
        assert (report.first_ts, report.last_ts, report.dead) == (one.first_ts, one.last_ts, one.dead)
        np.testing.assert_array_equal(np.sort(report.event_ts), np.sort(one.event_ts))
        group, whole_figures = asdict(report.metrics), asdict(one.metrics)
        assert group.keys() == whole_figures.keys()
        for key, value in whole_figures.items():
            assert group[key] == pytest.approx(value, rel=1e-6, nan_ok=True), key
    assert not math.isnan(one.metrics.gauc) and not math.isnan(one.metrics.tell_category_auc)
    assert whole.to_words().nbytes == 400 * RECORD.itemsize


def test_the_group_loss_weights_each_rank_by_its_samples_and_is_nan_when_none_trained() -> None:
    found, probs, known = scored_samples(10)
    halves = [
        Scored.of(SampleColumns.from_samples([]), probs[:0], known[:0]),
        Scored.of(SampleColumns.from_samples(found), probs, known),
    ]
    nothing = TrainResult(math.nan, 2, 0)  # a rank without samples steps on padding
    (_, train, _), _ = two_ranks(halves, [nothing, TrainResult(0.4, 2, 0, samples=10)], [0, 0])
    assert train.loss == pytest.approx(0.4) and train.samples == 10
    (_, train, _), _ = two_ranks(halves, [nothing, replace(nothing, skipped_steps=2)], [0, 0])
    assert math.isnan(train.loss) and train.samples == 0
