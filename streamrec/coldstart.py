"""The cold-start fallback: one definition for the backtester and for serving.

"New" is exact. A *new item* has never been the target of a sample learnt before the
current micro-batch (it has no row of its own yet). A *new user* has an empty history at
the sample's time (``seq_lengths == 0``).

The fallback reads per-item counts over the samples learnt so far:

- for a new item, its *prior*: the item's positive rate smoothed toward its category's,
  itself smoothed toward the global rate: ``category = (c_positives + k * global) /
  (c_samples + k)``, ``prior = (positives + k * category) / (samples + k)``, k =
  `PRIOR_SAMPLES`. For an item never seen that is its category's rate, and for a category
  never seen (or no category) the global rate;
- for a new user, the *popular ranking*: ``1 - 1 / (2 + log1p(positives))`` of each
  candidate, the popularity baseline's score (`streamrec.replay.baselines`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from streamrec.learner.columns import SampleColumns

# As the item-rate baseline's: the prior weighs as this many samples.
PRIOR_SAMPLES = 10.0


class ItemPrior:
    """Per-item and per-category positives and samples from the samples learnt so far."""

    def __init__(self) -> None:
        self.positives: dict[str, float] = {}
        self.samples: dict[str, float] = {}
        self.category_positives: dict[str, float] = {}
        self.category_samples: dict[str, float] = {}

    def learn(
        self, items: Iterable[str], labels: Iterable[float], categories: Iterable[str] | None = None
    ) -> None:
        """Count each item's sample and its label, and its category's when given."""
        labels = [float(label) for label in labels]
        _count(self.positives, self.samples, items, labels)
        if categories is not None:
            _count(self.category_positives, self.category_samples, categories, labels)

    def learn_batch(self, batch: SampleColumns) -> None:
        """`learn` a micro-batch's targets."""
        self.learn(batch.target_ids("item"), batch.label.tolist(), batch.target_ids("category"))

    def copy(self) -> ItemPrior:
        """The counts as they stand now, apart from later learning."""
        other = ItemPrior()
        other.positives, other.samples = dict(self.positives), dict(self.samples)
        other.category_positives = dict(self.category_positives)
        other.category_samples = dict(self.category_samples)
        return other

    @property
    def global_rate(self) -> float:
        """The positive rate over every sample learnt; 0.5 before any."""
        total = sum(self.samples.values())
        return sum(self.positives.values()) / total if total else 0.5

    def known(self, items: Sequence[str]) -> np.ndarray:
        """bool[B]: whether each item has been learnt."""
        return np.fromiter((i in self.samples for i in items), dtype=bool, count=len(items))

    def prior(self, items: Sequence[str], categories: Sequence[str] | None = None) -> np.ndarray:
        """float64[B]: each item's smoothed positive rate (toward its category's, when given)."""
        rate = np.full(len(items), self.global_rate)
        if categories is not None:
            rate = _smoothed(self.category_positives, self.category_samples, categories, rate)
        return _smoothed(self.positives, self.samples, items, rate)

    def popularity(self, items: Sequence[str]) -> np.ndarray:
        """float64[B]: the popular ranking's score of each item, in (0, 1)."""
        pos = np.fromiter((self.positives.get(i, 0.0) for i in items), np.float64, len(items))
        return 1.0 - 1.0 / (2.0 + np.log1p(pos))

    def top(self, k: int) -> list[str]:
        """The ``k`` items with the most positives (ties: by id), the popular ranking's head."""
        return sorted(self.positives, key=lambda i: (-self.positives[i], i))[:k]


def new_users(batch: SampleColumns) -> np.ndarray:
    """bool[B]: samples whose user has an empty history."""
    return np.asarray(batch.seq_lengths == 0)


def with_fallback(
    scores: np.ndarray, batch: SampleColumns, prior: ItemPrior, *, items: bool, users: bool
) -> np.ndarray:
    """The model's ``scores`` with the fallback applied.

    New items get their prior, then every candidate of a new user the popular ranking.
    """
    out = np.asarray(scores, dtype=np.float64).copy()
    targets = batch.target_ids("item")
    if items:
        unknown = ~prior.known(targets)
        out[unknown] = prior.prior(_picked(targets, unknown), _picked(batch.target_ids("category"), unknown))
    if users:  # the popular ranking already puts a new item last
        cold = new_users(batch)
        out[cold] = prior.popularity(_picked(targets, cold))
    return out


def _picked(items: Sequence[str], mask: np.ndarray) -> list[str]:
    return [i for i, m in zip(items, mask.tolist(), strict=True) if m]


def _count(
    positives: dict[str, float], samples: dict[str, float], keys: Iterable[str], labels: Sequence[float]
) -> None:
    for key, label in zip(keys, labels, strict=True):
        positives[key] = positives.get(key, 0.0) + label
        samples[key] = samples.get(key, 0.0) + 1.0


def _smoothed(
    positives: dict[str, float], samples: dict[str, float], keys: Sequence[str], toward: np.ndarray
) -> np.ndarray:
    """Each key's positive rate with `PRIOR_SAMPLES` samples at ``toward`` added."""
    pos = np.fromiter((positives.get(k, 0.0) for k in keys), np.float64, len(keys))
    n = np.fromiter((samples.get(k, 0.0) for k in keys), np.float64, len(keys))
    return (pos + PRIOR_SAMPLES * toward) / (n + PRIOR_SAMPLES)
