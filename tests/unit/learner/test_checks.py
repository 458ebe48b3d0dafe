"""The contract checks catch what they are for: each fails on a learner broken in its way.

Each broken learner is the item-rate baseline (which passes every check) with one defect.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import pytest

from streamrec.learner.base import Learner, TrainResult
from streamrec.learner.checks import Promises, check_learner, yield_checks
from streamrec.learner.columns import SampleColumns
from streamrec.replay.baselines import ItemRateLearner


class Float32Scores(ItemRateLearner):
    def predict_many(self, batch: SampleColumns) -> np.ndarray:
        return super().predict_many(batch).astype(np.float32)


class CountsWhatItScores(ItemRateLearner):
    def predict_many(self, batch: SampleColumns) -> np.ndarray:
        scores = super().predict_many(batch)
        self.learn(batch)
        return scores


class RanksWithinTheBatch(ItemRateLearner):
    def predict_many(self, batch: SampleColumns) -> np.ndarray:
        scores = super().predict_many(batch)
        return scores / scores.max() if len(scores) else scores


class CountsEmptyBatches(ItemRateLearner):
    def learn_many(self, batch: SampleColumns) -> TrainResult:
        self.samples[0] = self.samples.get(0, 0.0) + 1.0
        self.positives.setdefault(0, 0.0)
        return super().learn_many(batch)


class NeedsTwoSamples(ItemRateLearner):
    def learn_many(self, batch: SampleColumns) -> TrainResult:
        if len(batch) == 1:
            raise ValueError("a batch of one")
        return super().learn_many(batch)


class NaNForStrangers(ItemRateLearner):
    def predict_many(self, batch: SampleColumns) -> np.ndarray:
        scores = super().predict_many(batch)
        scores[~self.is_known(batch)] = np.nan
        return scores


class KeepsStringsInItsState(ItemRateLearner):
    def state_arrays(self) -> dict[str, np.ndarray]:
        return {**super().state_arrays(), "state/names": np.array(["a", "b"])}


class LoadsOnlyTheCounts(ItemRateLearner):
    def load_state_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        super().load_state_arrays(arrays)
        self.positives = dict.fromkeys(self.positives, 0.0)


class KnowsEverything(ItemRateLearner):
    def is_known(self, batch: SampleColumns) -> np.ndarray:
        return np.ones(len(batch), dtype=bool)


class Unseeded(ItemRateLearner):
    def learn_many(self, batch: SampleColumns) -> TrainResult:
        result = super().learn_many(batch)
        for key in self.samples:
            self.samples[key] += float(np.random.default_rng().random())
        return result


class ForgetsItsClock(ItemRateLearner):
    """Halves the counts every third call, but keeps the call count out of its state."""

    calls = 0

    def learn_many(self, batch: SampleColumns) -> TrainResult:
        self.calls += 1
        if self.calls % 3 == 0:
            self.samples = {k: v / 2 for k, v in self.samples.items()}
            self.positives = {k: v / 2 for k, v in self.positives.items()}
        return super().learn_many(batch)


class LearnsNothing(ItemRateLearner):
    def learn_many(self, batch: SampleColumns) -> TrainResult:
        return TrainResult()


class PartsLearnNothing(ItemRateLearner):
    def learn_part(self, batch: SampleColumns) -> TrainResult:
        return TrainResult()

    def end_micro_batch(self) -> None:
        pass


def export_off_by_a_little(learner: Learner, root: Path) -> Callable[[SampleColumns], np.ndarray]:
    return lambda batch: learner.predict_many(batch) * 0.999


BROKEN: list[tuple[type[ItemRateLearner], str]] = [
    (Float32Scores, "scores_before_training"),
    (CountsWhatItScores, "predict_changes_nothing"),
    (RanksWithinTheBatch, "scores_are_per_sample"),
    (CountsEmptyBatches, "empty_batch"),
    (NeedsTwoSamples, "one_sample_batch"),
    (NaNForStrangers, "unknown_ids"),
    (KeepsStringsInItsState, "state_is_plain_arrays"),
    (LoadsOnlyTheCounts, "state_round_trip"),
    (KnowsEverything, "is_known"),
    (Unseeded, "seeded_runs_agree"),
    (ForgetsItsClock, "restored_state_resumes_exactly"),
    (LearnsNothing, "learns_a_learnable_batch"),
    (PartsLearnNothing, "one_part_is_the_micro_batch"),
]


def _check(factory: Callable[[], Learner], name: str, promises: Promises | None = None) -> Callable[[], None]:
    (check,) = [c for c in yield_checks(factory, promises) if c.name == name]
    return check


@pytest.mark.parametrize(("broken", "name"), BROKEN, ids=[name for _, name in BROKEN])
def test_the_check_catches_its_defect(broken: type[ItemRateLearner], name: str) -> None:
    _check(ItemRateLearner, name)()  # the learner it breaks passes
    with pytest.raises((AssertionError, ValueError, TypeError)):
        _check(broken, name)()


def test_the_export_check_catches_an_export_that_scores_otherwise() -> None:
    exact = Promises(export=lambda learner, root: learner.predict_many)
    _check(ItemRateLearner, "export_scores_as_the_learner", exact)()
    with pytest.raises(AssertionError, match="export: scores differ"):
        _check(ItemRateLearner, "export_scores_as_the_learner", Promises(export=export_off_by_a_little))()


def test_promises_not_made_are_not_checked() -> None:
    names = {c.name for c in yield_checks(ItemRateLearner, Promises(deterministic=False, learns=False))}
    assert not names & {"seeded_runs_agree", "restored_state_resumes_exactly", "learns_a_learnable_batch",
                        "export_scores_as_the_learner"}


def test_check_learner_names_the_check_that_failed() -> None:
    with pytest.raises(AssertionError, match="^predict_changes_nothing: "):
        check_learner(CountsWhatItScores)


class LacksIsKnown:
    """A user's learner that forgot ``is_known``: the contract's other four methods only."""

    def __init__(self) -> None:
        self.inner = ItemRateLearner()

    def predict_many(self, batch: SampleColumns) -> np.ndarray:
        return self.inner.predict_many(batch)

    def learn_many(self, batch: SampleColumns) -> TrainResult:
        return self.inner.learn_many(batch)

    def state_arrays(self) -> dict[str, np.ndarray]:
        return self.inner.state_arrays()

    def load_state_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.inner.load_state_arrays(arrays)


def test_check_learner_names_the_check_where_a_learner_raises() -> None:
    """A learner that raises (here: lacks a method) fails as an AssertionError naming the check."""
    with pytest.raises(AssertionError, match="^predict_changes_nothing: AttributeError: .*is_known"):
        check_learner(LacksIsKnown)  # type: ignore[arg-type]  # the defect under test
    with pytest.raises(AssertionError, match="^one_sample_batch: ValueError: a batch of one"):
        check_learner(NeedsTwoSamples)
