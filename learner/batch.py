"""The typed training/scoring batch: samples hashed into fixed-shape numpy arrays."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from streamrec.config import ModelConfig
from streamrec.learner.hashing import PADDING_BUCKET, bucketize
from streamrec.samples import Sample


@dataclass(frozen=True, eq=False)
class Batch:
    """Hashed samples ready for the model. B: batch, T: sequence length.

    Sequences are right-aligned: the most recent behaviour sits at position T-1 and padding
    (bucket 0) fills the left. A sequence longer than T keeps its T most recent behaviours.

    Attributes:
        target_item: int64[B] item bucket of the scored item.
        target_category: int64[B] category bucket of the scored item.
        seq_items: int64[B, T] item buckets of earlier behaviours, 0 = padding.
        seq_categories: int64[B, T] category buckets of those behaviours, 0 = padding.
        label: float32[B] 1.0 for a positive, 0.0 for a negative.
        user_ids: str[B] the users, for per-user metrics such as GAUC.
    """

    target_item: np.ndarray
    target_category: np.ndarray
    seq_items: np.ndarray
    seq_categories: np.ndarray
    label: np.ndarray
    user_ids: np.ndarray

    def __post_init__(self) -> None:
        """Reject arrays whose shapes disagree, so a bad batch fails here, not in the model."""
        size = self.target_item.shape[0]
        flat = (self.target_item, self.target_category, self.label, self.user_ids)
        if any(a.shape != (size,) for a in flat):
            raise ValueError("target_item, target_category, label and user_ids must be [B]")
        if self.seq_items.ndim != 2 or self.seq_items.shape[0] != size:
            raise ValueError(f"seq_items must be [B, T], got {self.seq_items.shape}")
        if self.seq_categories.shape != self.seq_items.shape:
            raise ValueError("seq_categories must have the shape of seq_items")

    def __len__(self) -> int:
        """The number of samples, B."""
        return int(self.target_item.shape[0])

    @property
    def sequence_length(self) -> int:
        """T, the padded length of every behaviour sequence."""
        return int(self.seq_items.shape[1])

    def take(self, indices: np.ndarray | Sequence[int]) -> Batch:
        """A new batch of the rows at ``indices`` (in that order), for shuffling and chunking."""
        idx = np.asarray(indices, dtype=np.int64)
        return Batch(
            target_item=self.target_item[idx],
            target_category=self.target_category[idx],
            seq_items=self.seq_items[idx],
            seq_categories=self.seq_categories[idx],
            label=self.label[idx],
            user_ids=self.user_ids[idx],
        )

    @classmethod
    def from_samples(cls, samples: Sequence[Sample], cfg: ModelConfig) -> Batch:
        """Hash and pad samples into a batch shaped by ``cfg``.

        Args:
            samples: Samples whose sequences are oldest first.
            cfg: Supplies ``item_buckets``, ``category_buckets`` and ``sequence_length``.

        Returns:
            The batch, rows in the order of ``samples``.

        Raises:
            ValueError: If a sample's item and category sequences differ in length.
        """
        t = cfg.sequence_length
        tails = [_latest(s, t) for s in samples]
        lengths = np.fromiter((len(items) for items, _ in tails), dtype=np.int64, count=len(tails))
        flat_items = [i for items, _ in tails for i in items]
        flat_cats = [c for _, cats in tails for c in cats]
        rows = np.repeat(np.arange(len(samples), dtype=np.int64), lengths)
        # Position of each behaviour within its row, right-aligned so the latest is at T-1.
        starts = np.cumsum(lengths) - lengths
        cols = np.arange(len(flat_items), dtype=np.int64) - np.repeat(starts, lengths)
        cols += np.repeat(t - lengths, lengths)
        seq_items = np.full((len(samples), t), PADDING_BUCKET, dtype=np.int64)
        seq_cats = np.full((len(samples), t), PADDING_BUCKET, dtype=np.int64)
        seq_items[rows, cols] = bucketize(flat_items, cfg.item_buckets)
        seq_cats[rows, cols] = bucketize(flat_cats, cfg.category_buckets)
        return cls(
            target_item=bucketize([s.item_id for s in samples], cfg.item_buckets),
            target_category=bucketize([s.category_id for s in samples], cfg.category_buckets),
            seq_items=seq_items,
            seq_categories=seq_cats,
            label=np.array([s.label for s in samples], dtype=np.float32),
            user_ids=np.array([s.user_id for s in samples], dtype=np.str_),
        )


def _latest(sample: Sample, t: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The sample's ``t`` most recent behaviours (items, categories), oldest first."""
    if len(sample.seq_items) != len(sample.seq_categories):
        raise ValueError(
            f"sample {sample.sample_id}: {len(sample.seq_items)} items but "
            f"{len(sample.seq_categories)} categories in its sequence"
        )
    start = max(len(sample.seq_items) - t, 0)
    return sample.seq_items[start:], sample.seq_categories[start:]
