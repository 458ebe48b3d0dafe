"""Deep Interest Network (Zhou et al., KDD 2018) in ``paddle.nn``, built from named parts.

``DIN`` = ``EmbeddingArch`` (hashed item and category tables) + ``LocalActivationUnit``
(target-aware attention over the behaviour sequence) + ``MLPHead`` (the click predictor).
``DINTrain`` owns the loss. The model stays in this module, free of lambdas and closures,
because ``paddle.jit.save`` reads the source of ``forward`` from a real file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import paddle
import paddle.nn.functional as F
from paddle import nn

from streamrec.config import ModelConfig
from streamrec.learner.hashing import PADDING_BUCKET


class EmbeddingArch(nn.Layer):
    """Item and category tables; a behaviour or target vector is concat(item_emb, cat_emb).

    Row 0 of both tables is padding: it looks up as zeros and is never updated.
    """

    def __init__(self, cfg: ModelConfig, sparse: bool) -> None:
        """Build the two tables.

        Args:
            cfg: Supplies the bucket counts and ``embedding_dim``.
            sparse: Emit sparse (row) gradients, so an optimizer step touches only looked-up
                rows rather than the whole table.
        """
        super().__init__()
        dim = cfg.embedding_dim
        self.item = nn.Embedding(cfg.item_buckets, dim, padding_idx=PADDING_BUCKET, sparse=sparse)
        self.category = nn.Embedding(
            cfg.category_buckets, dim, padding_idx=PADDING_BUCKET, sparse=sparse
        )
        self.output_dim = 2 * dim

    def forward(self, items: paddle.Tensor, categories: paddle.Tensor) -> paddle.Tensor:
        """Embed ids of any shape [...] into vectors [..., 2D]."""
        return paddle.concat([self.item(items), self.category(categories)], axis=-1)


def _mlp(in_dim: int, units: Sequence[int], data_format: Literal["NC", "NLC"]) -> nn.Sequential:
    """Linear + PReLU blocks and a final one-unit Linear.

    PReLU is the DIN paper's baseline activation (Dice's ancestor). ``data_format`` tells
    PReLU where its channels are: ``NC`` for [B, C] inputs, ``NLC`` for [B, T, C].
    """
    layers: list[nn.Layer] = []
    for width in units:
        prelu = nn.PReLU(num_parameters=width, data_format=data_format)
        layers.extend([nn.Linear(in_dim, width), prelu])
        in_dim = width
    layers.append(nn.Linear(in_dim, 1))
    return nn.Sequential(*layers)


class LocalActivationUnit(nn.Layer):
    """DIN attention: one weight per behaviour from [q, k, q-k, q*k], then a weighted sum.

    As in the paper the weights are not softmax-normalised, so the pooled vector's size keeps
    how strongly the history relates to the target. Padding positions get weight 0.
    """

    def __init__(self, dim: int, units: Sequence[int]) -> None:
        """Build the scoring MLP.

        Args:
            dim: Size of the query and key vectors (2D).
            units: Hidden widths of the scoring MLP (``cfg.attention_units``).
        """
        super().__init__()
        self.score = _mlp(4 * dim, units, "NLC")

    def forward(
        self, query: paddle.Tensor, keys: paddle.Tensor, mask: paddle.Tensor
    ) -> paddle.Tensor:
        """Pool the keys by their relevance to the query.

        Args:
            query: [B, 2D] target vectors.
            keys: [B, T, 2D] behaviour vectors.
            mask: [B, T] float, 1 for a real behaviour and 0 for padding.

        Returns:
            [B, 2D] the user-interest vector.
        """
        q = query.unsqueeze(1).expand_as(keys)
        features = paddle.concat([q, keys, q - keys, q * keys], axis=-1)
        weights = self.score(features).squeeze(-1) * mask
        return (weights.unsqueeze(-1) * keys).sum(axis=1)


class MLPHead(nn.Layer):
    """The click predictor over concat(target, interest, sum-pooled sequence) → one logit."""

    def __init__(self, dim: int, units: Sequence[int]) -> None:
        """Build the MLP.

        Args:
            dim: Size of each of the three input vectors (2D).
            units: Hidden widths (``cfg.mlp_units``).
        """
        super().__init__()
        self.mlp = _mlp(3 * dim, units, "NC")

    def forward(
        self, target: paddle.Tensor, interest: paddle.Tensor, pooled: paddle.Tensor
    ) -> paddle.Tensor:
        """Map [B, 2D] target, interest and pooled vectors to [B] logits."""
        return self.mlp(paddle.concat([target, interest, pooled], axis=-1)).squeeze(-1)


class DIN(nn.Layer):
    """Deep Interest Network. B: batch, T: sequence length, D: embedding dim.

    Inputs are int64 buckets: target_item and target_category [B], seq_items and
    seq_categories [B, T] with 0 for padding. The output is [B] click logits.
    """

    def __init__(self, cfg: ModelConfig, sparse: bool = True) -> None:
        """Build the three parts from ``cfg``.

        Args:
            cfg: The model hyper-parameters.
            sparse: Sparse embedding gradients (see ``EmbeddingArch``).
        """
        super().__init__()
        self.embedding = EmbeddingArch(cfg, sparse)
        dim = self.embedding.output_dim
        self.attention = LocalActivationUnit(dim, cfg.attention_units)
        self.head = MLPHead(dim, cfg.mlp_units)

    def forward(
        self,
        target_item: paddle.Tensor,
        target_category: paddle.Tensor,
        seq_items: paddle.Tensor,
        seq_categories: paddle.Tensor,
    ) -> paddle.Tensor:
        """Score each target against its user's behaviour sequence; returns [B] logits."""
        target = self.embedding(target_item, target_category)
        keys = self.embedding(seq_items, seq_categories)
        mask = (seq_items != PADDING_BUCKET).astype(keys.dtype)
        interest = self.attention(target, keys, mask)
        pooled = (keys * mask.unsqueeze(-1)).sum(axis=1)
        return self.head(target, interest, pooled)


class Penalty(nn.Layer):
    """A regularisation term added to the loss (online EWC in a later issue).

    A penalty is a sublayer of ``DINTrain``, so whatever state it keeps (anchor weights,
    Fisher estimates) as parameters or persistable buffers is snapshotted with the model.
    """

    def forward(self, model: DIN) -> paddle.Tensor:
        """The scalar penalty for the model's current parameters."""
        raise NotImplementedError


class DINTrain(nn.Layer):
    """The training wrapper: mean binary cross-entropy on the logits plus any penalties."""

    def __init__(self, model: DIN, penalties: Sequence[Penalty] = ()) -> None:
        """Wrap ``model``; ``penalties`` are summed into the loss."""
        super().__init__()
        self.model = model
        self.penalties = nn.LayerList(list(penalties))

    def forward(
        self,
        target_item: paddle.Tensor,
        target_category: paddle.Tensor,
        seq_items: paddle.Tensor,
        seq_categories: paddle.Tensor,
        label: paddle.Tensor,
    ) -> paddle.Tensor:
        """The scalar training loss for one mini-batch; ``label`` is float32 [B]."""
        logits = self.model(target_item, target_category, seq_items, seq_categories)
        loss = F.binary_cross_entropy_with_logits(logits, label)
        for penalty in self.penalties:
            loss = loss + penalty(self.model)
        return loss
