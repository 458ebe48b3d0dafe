"""The model's inputs: every table of a `FeaturePlan` (``EmbeddingArch``) and the wide biases (``WideArch``).

Training on the CPU looks each distinct row up once (`distinct_lookup`), and DIN's target
vectors and keys are built from each distinct tuple of rows (`distinct_keys`): the sparse
gradients then hold one row per id, not one per position. Split from `streamrec.learner.model`
(the DIN and its parts) by job; as there, no lambdas or closures: ``paddle.jit.save`` reads
the source of what ``forward`` calls from a real file.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import paddle
from paddle import nn

from streamrec.config import ModelConfig
from streamrec.learner.features import FeaturePlan, PlannedFeature
from streamrec.learner.hashing import PADDING_BUCKET


class EmbeddingArch(nn.Layer):
    """Every table of a `FeaturePlan`, built-in or declared, one ``nn.Embedding`` each, by table name.

    One loop builds them (in the plan's order, which keeps the seeded start) and one function
    looks a feature up (`lookup`), whatever its table. Row 0 of every table is padding: it
    looks up as zeros and is never updated.
    """

    def __init__(self, plan: FeaturePlan, sparse: bool, rows: Mapping[str, int]) -> None:
        """Build the tables.

        Args:
            plan: The tables (``plan.tables``) and the features they embed.
            sparse: Emit sparse (row) gradients, so an optimizer step touches only looked-up
                rows rather than the whole table.
            rows: Each table's rows now (a dynamic table grows).
        """
        super().__init__()
        self.tables = nn.LayerDict(
            {
                name: nn.Embedding(rows[name], dim, padding_idx=PADDING_BUCKET, sparse=sparse)
                for name, (_, dim) in plan.tables.items()
            }
        )
        # Training looks a built-in feature's distinct rows up once each (`distinct_lookup`);
        # a model may keep to a lookup per position (DeepFM does, as it always has).
        self.distinct = True

    def lookup(self, feature: PlannedFeature, x: paddle.Tensor) -> paddle.Tensor:
        """One feature's vectors [..., width] from its input.

        An id's rows [...] look up its table; ids' rows [..., M] are mean-pooled over the
        non-padding ones (none: zeros); a number [...] is its own one column. Training on the
        CPU looks a built-in feature's distinct rows up once each (`distinct_lookup`).
        """
        if feature.table is None:
            return x.unsqueeze(-1)
        table = self.tables[feature.table]
        if feature.builtin and self.distinct and self.training and DISTINCT_LOOKUPS:
            return distinct_lookup(table, x)
        return lookup_feature(table, feature, x)


# Training looks each distinct row of a lookup up once (`distinct_lookup`). Measured (bench/
# learner_scaling.py, MovieLens, 30,000 samples, alternate runs): one rank's CPU seconds alike
# (training 6.24 s both ways); a rank of two 3.5-3.8 s instead of 4.0-4.2 s, its all-gathered
# row gradients 40x smaller.
DISTINCT_LOOKUPS = True


def distinct_lookup(table: nn.Layer, ids: paddle.Tensor) -> paddle.Tensor:
    """``table(ids)``, looking each distinct row up once: its sparse gradient has one row per id.

    A mini-batch's sequences repeat few ids many times (a user's history in each of its
    samples): measured on MovieLens, 256 samples x 51 positions held 322 distinct items. A
    lookup per position makes a row gradient of 13,056 rows, which the optimizer merges and
    several ranks all-gather; this makes one of 322.
    """
    if not ids.place.is_cpu_place():
        return table(ids)
    distinct, inverse = np.unique(ids.numpy(), return_inverse=True)
    found = table(paddle.to_tensor(distinct))
    return paddle.gather(found, paddle.to_tensor(inverse.ravel())).reshape([*ids.shape, -1])


# A tuple of rows becomes one int64 key while the tables' rows multiply to no more than this.
TUPLE_KEY_LIMIT = 2**62


def distinct_keys(
    tables: Sequence[nn.Layer], targets: Sequence[paddle.Tensor], sequences: Sequence[paddle.Tensor]
) -> tuple[paddle.Tensor, paddle.Tensor]:
    """The target vectors [B, D] and the keys [B, T, D + 1] (a last column of ones) of DIN's forward.

    The same values as each table's lookup of ``targets[i]`` [B] and ``sequences[i]`` [B, T],
    concatenated in table order (and the ones column), with each distinct tuple of rows (a
    position's row in every table) looked up once: one lookup per table of the distinct
    tuples, one concatenation of those few rows, one gather for the targets and one for the
    keys. A per-table lookup of each kind and the keys' concatenation build and, backward,
    split [B, T, D] tensors (measured: the keys' concatenation's gradient alone ~10% of a
    training step); this reads and writes them once. The gradients are the same sums, in
    another order.
    """
    n = len(tables)
    b, t = sequences[0].shape
    ids = [np.concatenate([targets[i].numpy(), sequences[i].numpy().ravel()]) for i in range(n)]
    sizes = [int(table.weight.shape[0]) for table in tables]
    if math.prod(sizes) <= TUPLE_KEY_LIMIT:
        key = ids[0]  # the tuple as one mixed-radix number: np.unique on int64 is the fast one
        for i in range(1, n):
            key = key * sizes[i] + ids[i]
        distinct, inverse = np.unique(key, return_inverse=True)
        rows: list[np.ndarray] = []
        for i in reversed(range(n)):
            distinct, row = np.divmod(distinct, sizes[i])
            rows.insert(0, row)
    else:
        tuples, inverse = np.unique(np.stack(ids, axis=1), axis=0, return_inverse=True)
        rows = [np.ascontiguousarray(tuples[:, i]) for i in range(n)]
    found = paddle.concat([tables[i](paddle.to_tensor(rows[i])) for i in range(n)], axis=-1)
    ones = paddle.ones([found.shape[0], 1], dtype=found.dtype)
    inverse = inverse.ravel()
    target = paddle.gather(found, paddle.to_tensor(inverse[:b]))
    keys = paddle.gather(paddle.concat([found, ones], axis=-1), paddle.to_tensor(inverse[b:]))
    return target, keys.reshape([b, t, -1])


def lookup_feature(table: nn.Layer, feature: PlannedFeature, x: paddle.Tensor) -> paddle.Tensor:
    """A feature's rows looked up in ``table``: [..., width].

    An id's rows [...] as they are; ids' rows [..., M] mean-pooled over the non-padding ones
    (none: zeros).
    """
    vectors = table(x)
    if not feature.pooled:
        return vectors
    present = (x != PADDING_BUCKET).astype(vectors.dtype).unsqueeze(-1)
    return (vectors * present).sum(axis=-2) / paddle.clip(present.sum(axis=-2), min=1.0)


class WideArch(nn.Layer):
    """The wide part: one learned bias per id of each of its tables, added to the logit.

    DIN's covers the built-in features' tables (the item's, the category's, the user's) and
    the declared behaviour features' of ids (`streamrec.learner.model.biased`), DeepFM's
    (FM's first order) every table.

    A counter knows each item's positive rate after a few samples; an embedding read through
    the MLP needs many. A bias per id learns it directly, with its own, larger learning rate
    (``ModelConfig.wide_lr_scale`` times the model's), and starts at zero.
    """

    def __init__(
        self, cfg: ModelConfig, sparse: bool, rows: Mapping[str, int], tables: Sequence[str]
    ) -> None:
        """One ``rows`` x 1 table per table of ``tables``."""
        super().__init__()
        attr = paddle.ParamAttr(initializer=nn.initializer.Constant(0.0), learning_rate=cfg.wide_lr_scale)
        self.biases = nn.LayerDict(
            {
                name: nn.Embedding(rows[name], 1, padding_idx=PADDING_BUCKET, sparse=sparse, weight_attr=attr)
                for name in tables
            }
        )

    def bias(self, feature: PlannedFeature, x: paddle.Tensor) -> paddle.Tensor:
        """A feature's bias [...] from its rows (ids': their biases' mean)."""
        if feature.table is None:
            raise ValueError(f"feature {feature.name!r} is a number: it has no rows to weigh")
        return lookup_feature(self.biases[feature.table], feature, x).squeeze(-1)
