"""Update strategies, and one prequential run of a strategy over the micro-batches.

Every micro-batch is scored by the model *before* it trains on it (prequential evaluation),
so every strategy is judged on exactly the same out-of-sample samples:

- ``popularity``: log count of the item's earlier positives;
- ``item-rate``: the item's smoothed positive rate in earlier micro-batches;
- ``features``: online logistic regression on the causal match features (the target in the
  user's history, the history's share in its category, ...);
- ``vw``: Vowpal Wabbit's online logistic regression on the ids, their pairwise interactions
  and the match features (`streamrec.replay.vw`; optional: the ``vw`` extra);
- ``static``: a DIN trained on the first ``warmup`` fraction of micro-batches, then frozen;
- ``finetune``: a DIN updated on every micro-batch, no regularisation;
- ``ewc``: a DIN updated with online EWC at a given lambda (``finetune`` is lambda 0);
- ``retrain``: a DIN retrained from scratch on all samples so far every ``retrain_every``
  micro-batches, incremental in between;
- ``deepfm``: the built-in DeepFM (`streamrec.learner.deepfm`) updated on every micro-batch as
  ``finetune`` is, on the same tables and training settings: the second model beside DIN.

Forgetting is measured on probes: every fifth sample of each micro-batch the model trained
on is scored right after that training and again by the final model.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from streamrec.config import ModelConfig
from streamrec.features import FeatureSchema
from streamrec.learner.base import Learner
from streamrec.learner.columns import SampleColumns
from streamrec.learner.metrics import gauc
from streamrec.learner.outputs import checked_result, checked_scores, learner_name, raised_by
from streamrec.learner.registry import make_learner
from streamrec.replay.baselines import ItemRateLearner, PopularityLearner
from streamrec.replay.batches import MicroBatch
from streamrec.replay.features import FeaturesLearner
from streamrec.samples import Sample

Kind = Literal[
    "popularity", "item-rate", "features", "vw", "static", "finetune", "ewc", "retrain", "deepfm"
]
KINDS: tuple[Kind, ...] = (
    "popularity", "item-rate", "features", "vw", "static", "finetune", "ewc", "retrain", "deepfm"
)
#: What a backtest runs unless told: every strategy but the optional ones (``vw`` needs an
#: extra) and the second model (``deepfm``: asked for by name, so the default run's cost and
#: figures stay those of the update strategies).
DEFAULT_KINDS: tuple[Kind, ...] = tuple(k for k in KINDS if k not in ("vw", "deepfm"))
# Every PROBE_EVERY-th sample of a micro-batch is a probe: deterministic, and a fifth is
# enough for a stable AUC on micro-batches of a few thousand samples.
PROBE_EVERY = 5

#: The ewc strategy's λ when neither ``--ewc-lambda`` nor the model sets one. From the
#: sweeps (README, "Backtesting"): at one pass the gentlest λ that visibly cuts forgetting
#: (MovieLens 0.019 -> 0.012, Taobao 0.045 -> 0.036) for the least GAUC (-0.003, -0.009);
#: λ >= 1 costs Taobao, where most targets are new and the model must keep moving, 0.05+.
DEFAULT_EWC_LAMBDA = 0.1

#: ``(strategy name, micro-batches done, of how many, the latest micro-batch's GAUC)``.
Progress = Callable[[str, int, int, float], None]


@dataclass(frozen=True)
class Strategy:
    """One way to keep a model up to date, with what it needs to run."""

    name: str
    kind: Kind
    model: ModelConfig = field(default_factory=ModelConfig)
    warmup: float = 0.25  # static: the fraction of micro-batches it trains on
    retrain_every: int = 10  # retrain: micro-batches between retrains from scratch
    # ewc: None takes the model's, or DEFAULT_EWC_LAMBDA when that is 0; the others train without
    ewc_lambda: float | None = None
    # The features its learner is made for: the deployment's, or an ablation's reduced one.
    schema: FeatureSchema = field(default_factory=FeatureSchema.default)

    @property
    def lam(self) -> float:
        """The EWC lambda this strategy's DIN trains with."""
        if self.kind != "ewc":
            return 0.0
        if self.ewc_lambda is not None:
            return self.ewc_lambda
        return self.model.ewc_lambda or DEFAULT_EWC_LAMBDA

    def make_learner(self) -> Learner:
        """A fresh learner for this strategy."""
        if self.kind == "popularity":
            return PopularityLearner()
        if self.kind == "item-rate":
            return ItemRateLearner()
        if self.kind == "features":
            return FeaturesLearner()
        if self.kind == "vw":
            from streamrec.replay.vw import VWLearner  # optional: the vw extra

            return VWLearner()
        if self.kind == "deepfm":
            # The schema too: DeepFM reads the declared features as DIN does.
            return make_learner(
                self.model.model_copy(update={"learner": "deepfm", "ewc_lambda": 0.0}), self.schema
            )
        # The configured learner (DIN by default: Paddle loads only then).
        return make_learner(self.model.model_copy(update={"ewc_lambda": self.lam}), self.schema)

    def trains_on(self, index: int, total: int) -> bool:
        """Whether the strategy trains on micro-batch ``index`` of ``total``."""
        return self.kind != "static" or index < max(1, round(self.warmup * total))

    def retrains_after(self, index: int) -> bool:
        """Whether the strategy retrains from scratch after micro-batch ``index``."""
        return self.kind == "retrain" and (index + 1) % self.retrain_every == 0


@dataclass
class StrategyRun:
    """What a run recorded: prequential scores per micro-batch, probes, costs."""

    name: str
    kind: Kind
    scores: list[np.ndarray] = field(default_factory=list)  # per micro-batch, before training
    probe_after: dict[int, np.ndarray] = field(default_factory=dict)  # right after training
    probe_final: dict[int, np.ndarray] = field(default_factory=dict)  # by the final model
    penalty_shares: list[float] = field(default_factory=list)  # EWC's, per micro-batch trained
    train_seconds: float = 0.0
    score_seconds: float = 0.0


def probe(batch: MicroBatch) -> SampleColumns:
    """The probe samples of a micro-batch."""
    return SampleColumns.from_samples(batch.samples[::PROBE_EVERY])


def run_strategy(
    strategy: Strategy, batches: Sequence[MicroBatch], on_progress: Progress | None = None
) -> StrategyRun:
    """Score each micro-batch, then let the strategy train on it; probe for forgetting."""
    run = StrategyRun(strategy.name, strategy.kind)
    learner = strategy.make_learner()
    who = learner_name(learner)
    seen: list[Sample] = []
    for index, micro in enumerate(batches):
        where = f"strategy {strategy.name}, micro-batch {index + 1} of {len(batches)}"
        batch = SampleColumns.from_samples(micro.samples)
        start = time.perf_counter()
        with raised_by(who, "predict_many", where):
            scores = learner.predict_many(batch)
        run.scores.append(checked_scores(scores, len(batch), who))
        run.score_seconds += time.perf_counter() - start
        if strategy.trains_on(index, len(batches)):
            seen += micro.samples
            start = time.perf_counter()
            with raised_by(who, "learn_many", where):
                result = learner.learn_many(batch)
            run.penalty_shares.append(checked_result(result, who).penalty_share)
            if strategy.retrains_after(index):
                learner = strategy.make_learner()
                with raised_by(who, "learn_many", f"{where}: retraining on all so far"):
                    checked_result(learner.learn_many(SampleColumns.from_samples(seen)), who)
            run.train_seconds += time.perf_counter() - start
            if index < len(batches) - 1:
                run.probe_after[index] = _probe_scores(learner, micro, who, where)
        if on_progress is not None:
            latest = gauc(batch.label, run.scores[-1], batch.user_ids)
            on_progress(strategy.name, index + 1, len(batches), latest)
    for index in run.probe_after:
        final = f"strategy {strategy.name}, the final model's probe of micro-batch {index + 1}"
        run.probe_final[index] = _probe_scores(learner, batches[index], who, final)
    return run


def _probe_scores(learner: Learner, micro: MicroBatch, who: str, where: str) -> np.ndarray:
    """The learner's scores of ``micro``'s probe samples, checked."""
    samples = probe(micro)
    with raised_by(who, "predict_many", f"{where}: its probe"):
        scores = learner.predict_many(samples)
    return checked_scores(scores, len(samples), who)
