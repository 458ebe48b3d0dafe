"""The simple baselines every model must beat, as learners of the same contract.

Both score a target item by what earlier micro-batches said about it, and know nothing of
the user or the sequence: a DIN that does not beat them learns nothing a counter cannot.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from streamrec.learner.base import TrainResult
from streamrec.learner.columns import SampleColumns, require_columns
from streamrec.learner.hashing import fingerprint

# The Beta prior's weight in pseudo-samples: an item needs about this many samples before
# its own rate outweighs the global one. Ten is the usual choice for rates of a few percent
# to a few tens of percent, and was not tuned on the test data.
PRIOR_SAMPLES = 10.0


class _ItemCounts:
    """Per-item positives and samples from the micro-batches learnt so far.

    Items are keyed by their `fingerprint`, as the model's
    id maps key them, so the state is numbers a snapshot (safetensors) stores.
    """

    def __init__(self) -> None:
        self.positives: dict[int, float] = {}
        self.samples: dict[int, float] = {}

    @staticmethod
    def keys(batch: SampleColumns) -> list[int]:
        """[B] each target item's fingerprint.

        Raises:
            TypeError: ``batch`` is not a `SampleColumns`.
        """
        return fingerprint(require_columns(batch).target_ids("item")).tolist()

    def learn(self, batch: SampleColumns) -> TrainResult:
        for item, label in zip(self.keys(batch), batch.label.tolist(), strict=True):
            self.positives[item] = self.positives.get(item, 0.0) + label
            self.samples[item] = self.samples.get(item, 0.0) + 1.0
        return TrainResult(math.nan, steps=1)

    def is_known(self, batch: SampleColumns) -> np.ndarray:
        return np.fromiter((i in self.samples for i in self.keys(batch)), dtype=bool, count=len(batch))

    def state_arrays(self) -> dict[str, np.ndarray]:
        items = sorted(self.samples)
        return {
            "state/items": np.array(items, dtype=np.uint64),
            "state/positives": np.array([self.positives[i] for i in items], dtype=np.float64),
            "state/samples": np.array([self.samples[i] for i in items], dtype=np.float64),
        }

    def load_state_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        items = arrays["state/items"].tolist()
        self.positives = dict(zip(items, arrays["state/positives"].tolist(), strict=True))
        self.samples = dict(zip(items, arrays["state/samples"].tolist(), strict=True))


class PopularityLearner(_ItemCounts):
    """Scores ``log(1 + the item's earlier positives)``, squashed into (0, 1) for logloss.

    The ranking is what counts (AUC, GAUC); the squashing ``p = 1 - 1 / (2 + log1p(n))`` keeps
    the order and gives logloss a finite, if uncalibrated, figure.
    """

    def predict_many(self, batch: SampleColumns) -> np.ndarray:
        """See `Learner`."""
        counts = np.fromiter(
            (self.positives.get(i, 0.0) for i in self.keys(batch)), dtype=np.float64, count=len(batch)
        )
        return 1.0 - 1.0 / (2.0 + np.log1p(counts))

    def learn_many(self, batch: SampleColumns) -> TrainResult:
        """See `Learner`."""
        return self.learn(batch)


class ItemRateLearner(_ItemCounts):
    """Scores the item's smoothed positive rate in earlier micro-batches.

    Scores the item's positive rate in earlier micro-batches, smoothed by a Beta prior
    centred on the global rate: ``(positives + k * global) / (samples + k)``, k =
    `PRIOR_SAMPLES`. On explicit ratings it is the strongest simple baseline.
    """

    def predict_many(self, batch: SampleColumns) -> np.ndarray:
        """See `Learner`."""
        total = sum(self.samples.values())
        prior = sum(self.positives.values()) / total if total else 0.5
        keys = self.keys(batch)
        pos = np.fromiter((self.positives.get(i, 0.0) for i in keys), np.float64, len(batch))
        n = np.fromiter((self.samples.get(i, 0.0) for i in keys), np.float64, len(batch))
        return (pos + PRIOR_SAMPLES * prior) / (n + PRIOR_SAMPLES)

    def learn_many(self, batch: SampleColumns) -> TrainResult:
        """See `Learner`."""
        return self.learn(batch)
