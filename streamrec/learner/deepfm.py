"""DeepFM (Guo et al., IJCAI 2017) in ``paddle.nn``, built from named parts, over DIN's tables.

``DeepFM`` = ``EmbeddingArch`` (the same tables as DIN) + ``WideArch`` (FM's first-order
weight per id) + ``FMInteraction`` (FM's second order: every pair of fields) + ``DNNArch``
(the deep part over the same field embeddings), summed into one logit, as PaddleRec's
``models/rank/deepfm``. The fields are the target's id in each behaviour table, the behaviour
history mean-pooled per behaviour table, and each context table's id (the user's). The model
stays in this module, free of lambdas and closures, because ``paddle.jit.save`` reads the
source of ``forward`` from a real file.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import paddle
from paddle import nn

from streamrec.config import ModelConfig
from streamrec.errors import ConfigError
from streamrec.learner.hashing import PADDING_BUCKET
from streamrec.learner.idmap import DEFAULT_ROW
from streamrec.learner.model import EmbeddingArch, MatchArch, WideArch, _mlp


class FMInteraction(nn.Layer):
    """FM's second-order term: the sum of the dot products of every pair of field vectors.

    Computed as ``0.5 * ((sum_f v_f)^2 - sum_f v_f^2)`` summed over D: linear in F.
    """

    def forward(self, fields: paddle.Tensor) -> paddle.Tensor:
        """[B, F, D] field vectors -> [B] pairwise interactions."""
        summed = fields.sum(axis=1)
        return 0.5 * (summed * summed - (fields * fields).sum(axis=1)).sum(axis=-1)


class DNNArch(nn.Layer):
    """The deep part: an MLP over the flattened field vectors and the dense features -> one logit.

    Its last layer starts at zero, so the model starts as the FM and learns what the MLP adds.
    """

    def __init__(self, in_dim: int, units: tuple[int, ...]) -> None:
        """Build the MLP (``cfg.mlp_units`` hidden widths)."""
        super().__init__()
        self.mlp = _mlp(in_dim, units, zero_out=True)

    def forward(self, features: paddle.Tensor) -> paddle.Tensor:
        """[B, C] -> [B] logits."""
        return self.mlp(features).squeeze(-1)


class DeepFM(nn.Layer):
    """DeepFM. B: batch, T: sequence length, F: fields, D: embedding dim (one for every table).

    Inputs as `streamrec.learner.model.DIN`'s, so both train from one `EncodedBatch` and
    export through one scoring graph: int64 table rows, lists in the order of the tables of
    each kind: ``targets`` [B] and ``sequences`` [B, T] (0 for padding) per behaviour table,
    ``context`` [B] per context table, and ``dense`` float32 [B, S] (the id statistics, S may
    be 0). The output is [B] click logits.

    Fields (F = 2 * behaviour tables + context tables): each behaviour table's target vector,
    its history mean-pooled (a user without history: zeros), each context table's vector.
    First order: each id's learned weight (the history's mean-pooled) and, with id statistics,
    a linear term over them that starts as DIN's does (the item's and the user's positive
    rate log-odds with weight 1). With ``cfg.match_features`` DIN's `MatchArch` features (the
    target's share and count in its own history, per behaviour table) are numeric fields too:
    inputs of the deep part and a linear term of the logit, as in DIN.
    """

    def __init__(
        self, cfg: ModelConfig, sparse: bool = True, rows: Mapping[str, int] | None = None
    ) -> None:
        """Build the parts from ``cfg``.

        Raises:
            ConfigError: the tables do not share one embedding dim (FM's dot products need it).
        """
        super().__init__()
        dims = sorted({t.dim for t in cfg.builtin_tables})
        if len(dims) != 1:
            raise ConfigError(
                f"STREAMREC_MODEL__TABLES: DeepFM needs one embedding dim for every table, got {dims}"
            )
        rows = {t.name: t.start_rows for t in cfg.builtin_tables} if rows is None else rows
        self.embedding = EmbeddingArch(cfg, sparse, rows)
        self.wide = WideArch(cfg, sparse, rows)
        self.interaction = FMInteraction()
        n_behaviour = len(self.embedding.behaviour)
        fields = 2 * n_behaviour + len(self.embedding.context)
        self.dense_dim = 2 * n_behaviour + 2 if cfg.id_stats else 0
        if self.dense_dim:
            start = [1.0] + [0.0] * (n_behaviour - 1) + [1.0]
            self.prior = self.create_parameter(
                [len(start)], default_initializer=nn.initializer.Assign(np.array(start, dtype=np.float32))
            )
        behaviour = [t for t in cfg.builtin_tables if t.name in self.embedding.behaviour]
        floors = [DEFAULT_ROW if t.ids == "dynamic" else PADDING_BUCKET for t in behaviour]
        self.match = MatchArch(floors, cfg.match_lr_scale, cfg.match_init) if cfg.match_features else None
        match_dim = self.match.width if self.match is not None else 0
        self.dnn = DNNArch(fields * dims[0] + self.dense_dim + match_dim, cfg.mlp_units)

    def forward(
        self,
        targets: list[paddle.Tensor],
        sequences: list[paddle.Tensor],
        context: list[paddle.Tensor],
        dense: paddle.Tensor,
        extras: list[paddle.Tensor] | None = None,
    ) -> paddle.Tensor:
        """Score each target; returns [B] logits (``extras`` is always empty: no declared features)."""
        behaviour = self.embedding.behaviour
        names = self.embedding.context
        mask = (sequences[0] != PADDING_BUCKET).astype("float32")
        length = paddle.clip(mask.sum(axis=1), min=1.0).unsqueeze(-1)
        fields: list[paddle.Tensor] = []
        first: list[paddle.Tensor] = []
        # Indexing, not zip(strict=True): paddle.jit's tracer (the serving export) lacks it.
        for i in range(len(behaviour)):
            table = self.embedding.tables[behaviour[i]]
            fields.append(table(targets[i]))
            fields.append((table(sequences[i]) * mask.unsqueeze(-1)).sum(axis=1) / length)
            bias = self.wide.biases[behaviour[i]]
            first.append(bias(targets[i]).squeeze(-1))
            first.append((bias(sequences[i]).squeeze(-1) * mask).sum(axis=1) / length.squeeze(-1))
        for i in range(len(names)):
            fields.append(self.embedding.tables[names[i]](context[i]))
            first.append(self.wide.biases[names[i]](context[i]).squeeze(-1))
        stacked = paddle.stack(fields, axis=1)
        deep = [paddle.flatten(stacked, start_axis=1)]
        if self.dense_dim:
            deep.append(dense)
        matches = self.match.features(targets, sequences, mask) if self.match is not None else None
        if matches is not None:
            deep.append(matches)
        logits = paddle.add_n(first) + self.interaction(stacked) + self.dnn(paddle.concat(deep, axis=-1))
        if self.match is not None and matches is not None:
            logits = logits + self.match(matches)
        if self.dense_dim:
            logits = logits + (dense[:, 0::2] * self.prior).sum(axis=-1)
        return logits
