"""DeepFM (Guo et al., IJCAI 2017) in ``paddle.nn``, built from named parts, over DIN's tables.

``DeepFM`` = ``EmbeddingArch`` (the same tables as DIN) + ``WideArch`` (FM's first-order
weight per id) + ``FMInteraction`` (FM's second order: every pair of fields) + ``DNNArch``
(the deep part over the same field embeddings), summed into one logit, as PaddleRec's
``models/rank/deepfm``. The fields are the target's id in each behaviour table, the behaviour
history mean-pooled per behaviour table, each context table's id (the user's), and the
declared features (`FeaturePlan`, embedded by DIN's code): one field per side of each. The
model stays in this module, free of lambdas and closures, because ``paddle.jit.save`` reads
the source of ``forward`` from a real file.
"""

from __future__ import annotations

from collections.abc import Mapping

import paddle
from paddle import nn

from streamrec.config import ModelConfig
from streamrec.errors import ConfigError
from streamrec.learner.features import FeaturePlan, PlannedFeature
from streamrec.learner.model import TableModel, WideArch, _mlp


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


class NumberField(nn.Layer):
    """One declared number as an FM field: x enters the first order as w * x, the second as x * v.

    Both start at zero, ``w`` as the ids' first-order weights do; so does ``v`` [D], unlike an
    embedding row: a value can be large before it is scaled (standardize's first micro-batch
    reads raw years, ~2000), and x * v with a random v swung FM's second order (a first
    MovieLens micro-batch's logloss 7.2 against 0.69). From zero v learns through its pairs
    with the other fields. The deep part reads x itself (`DeepFM`).
    """

    def __init__(self, dim: int) -> None:
        """A weight and a D-vector."""
        super().__init__()
        self.weight = self.create_parameter([1], default_initializer=nn.initializer.Constant(0.0))
        self.vector = self.create_parameter([dim], default_initializer=nn.initializer.Constant(0.0))

    def forward(self, x: paddle.Tensor) -> tuple[paddle.Tensor, paddle.Tensor]:
        """[B] values -> [B, D] the field's vector and [B] its first-order term."""
        return x.unsqueeze(-1) * self.vector, x * self.weight


def number_fields(plan: FeaturePlan | None) -> list[str]:
    """The names of the declared numbers' fields, in `FeaturePlan.input_keys` order.

    ``<feature>__target`` for the target's (or the user's, the context's) value and
    ``<feature>__history`` for the history's mean.
    """
    if plan is None:
        return []
    return [
        *(f"{f.name}__target" for f in plan.query if f.table is None),
        *(f"{f.name}__history" for f in plan.sequence if f.table is None),
        *(f"{f.name}__target" for f in plan.head if f.table is None),
    ]


class DeepFM(TableModel):
    """DeepFM. B: batch, T: sequence length, F: fields, D: embedding dim (one for every table).

    Inputs as `streamrec.learner.model.DIN`'s, so both train from one `EncodedBatch` and
    export through one scoring graph: int64 table rows, lists in the order of the tables of
    each kind: ``targets`` [B] and ``sequences`` [B, T] (0 for padding) per behaviour table,
    ``context`` [B] per context table, and ``dense`` float32 [B, S] (the id statistics, S may
    be 0). The output is [B] click logits.

    Fields (F = 2 * behaviour tables + context tables + the declared features' sides): each
    behaviour table's target vector, its history mean-pooled (a user without history: zeros),
    each context table's vector. First order: each id's learned weight (the history's
    mean-pooled) and, with id statistics, a linear term over them that starts as DIN's does
    (the item's and the user's positive rate log-odds with weight 1). With
    ``cfg.match_features`` DIN's `MatchArch` features (the target's share and count in its own
    history, per behaviour table) are numeric fields too: inputs of the deep part and a linear
    term of the logit, as in DIN.

    Declared features (``extras``, as DIN's: `FeaturePlan` order) are fields as the tables'
    ids are: a behaviour feature's target value and its history's mean (an outcome: the
    history's only), a user or context feature's value. An ``id`` (or a ``bucket`` number) is
    its table's vector and a first-order weight; ``ids`` their vectors' and weights' means. A
    number (`NumberField`) is x * v in the second order, w * x in the first, and x itself a
    column of the deep part's input.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        sparse: bool = True,
        rows: Mapping[str, int] | None = None,
        plan: FeaturePlan | None = None,
    ) -> None:
        """Build the parts from ``cfg`` and the declared features of ``plan``.

        Raises:
            ConfigError: the tables do not share one embedding dim (FM's dot products need it).
        """
        super().__init__()
        tables = {} if plan is None else plan.tables
        dims = sorted({t.dim for t in cfg.builtin_tables} | {d for _, d in tables.values()})
        if len(dims) != 1:
            raise ConfigError(
                f"STREAMREC_MODEL__TABLES: DeepFM needs one embedding dim for every table (the declared "
                f"features' too), got {dims}"
            )
        self.dim = dims[0]
        rows = self._build_inputs(cfg, sparse, rows, plan)
        self.wide = WideArch(cfg, sparse, rows, plan)
        self.interaction = FMInteraction()
        self.number_names = number_fields(plan)
        # Only with declared numbers, so a model without keeps its state's layout.
        self.numbers = (
            nn.LayerDict({n: NumberField(dims[0]) for n in self.number_names}) if self.number_names else None
        )
        n_behaviour = len(self.embedding.behaviour)
        extra_fields = sum(f.table is not None for f in (*self.x_query, *self.x_sequence, *self.x_head))
        fields = 2 * n_behaviour + len(self.embedding.context) + extra_fields
        counters = self._build_counters(cfg)
        self.dnn = DNNArch(fields * dims[0] + counters + len(self.number_names), cfg.mlp_units)

    def forward(
        self,
        targets: list[paddle.Tensor],
        sequences: list[paddle.Tensor],
        context: list[paddle.Tensor],
        dense: paddle.Tensor,
        extras: list[paddle.Tensor] | None = None,
    ) -> paddle.Tensor:
        """Score each target; returns [B] logits."""
        behaviour = self.embedding.behaviour
        names = self.embedding.context
        mask, counters, matches = self._open(targets, sequences, dense)
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
        values: list[paddle.Tensor] = []
        if extras:
            self._extra_fields(extras, mask, length, fields, first, values)
        stacked = paddle.stack(fields, axis=1)
        deep = [paddle.flatten(stacked, start_axis=1), *counters]
        if values:
            deep.append(paddle.stack(values, axis=1))
        interacting = stacked
        if self.numbers is not None and values:
            interacting = paddle.concat([stacked, self._number_vectors(self.numbers, values, first)], axis=1)
        logits = paddle.add_n(first) + self.interaction(interacting) + self.dnn(paddle.concat(deep, axis=-1))
        return self._close(logits, dense, matches)

    def _extra_fields(
        self,
        extras: list[paddle.Tensor],
        mask: paddle.Tensor,
        length: paddle.Tensor,
        fields: list[paddle.Tensor],
        first: list[paddle.Tensor],
        values: list[paddle.Tensor],
    ) -> None:
        """Append the declared features' fields, first-order terms and number values ([B] each).

        ``extras`` in `FeaturePlan.input_keys` order; along the history a feature is
        mean-pooled over the real behaviours (``mask`` [B, T], ``length`` [B, 1]).
        """
        nq, ns = len(self.x_query), len(self.x_sequence)
        for i in range(nq):
            self._one_side(self.x_query[i], extras[i], fields, first, values)
        for i in range(ns):
            f = self.x_sequence[i]
            x = extras[nq + i]
            if f.table is None:
                values.append((x * mask).sum(axis=1) / length.squeeze(-1))
            else:
                vectors = self.embedding.embed_feature(f, x)
                fields.append((vectors * mask.unsqueeze(-1)).sum(axis=1) / length)
                first.append((self.wide.feature_bias(f, x) * mask).sum(axis=1) / length.squeeze(-1))
        for i in range(len(self.x_head)):
            self._one_side(self.x_head[i], extras[nq + ns + i], fields, first, values)

    def _one_side(
        self,
        f: PlannedFeature,
        x: paddle.Tensor,
        fields: list[paddle.Tensor],
        first: list[paddle.Tensor],
        values: list[paddle.Tensor],
    ) -> None:
        """One value a sample has (not along its history): [B] (ids: [B, M]) into the lists."""
        if f.table is None:
            values.append(x)
            return
        fields.append(self.embedding.embed_feature(f, x))
        first.append(self.wide.feature_bias(f, x))

    def _number_vectors(
        self, numbers: nn.LayerDict, values: list[paddle.Tensor], first: list[paddle.Tensor]
    ) -> paddle.Tensor:
        """The numbers' FM fields [B, N, D]; their first-order terms are appended to ``first``."""
        vectors = []
        for i in range(len(self.number_names)):
            vector, term = numbers[self.number_names[i]](values[i])
            vectors.append(vector)
            first.append(term)
        return paddle.stack(vectors, axis=1)
