"""DeepFM (Guo et al., IJCAI 2017) in ``paddle.nn``, built from named parts, over DIN's tables.

``DeepFM`` = ``EmbeddingArch`` (the same tables as DIN) + ``WideArch`` (FM's first-order
weight per id) + ``FMInteraction`` (FM's second order: every pair of fields) + ``DNNArch``
(the deep part over the same field embeddings), summed into one logit, as PaddleRec's
``models/rank/deepfm``. The fields are every feature of its `FeaturePlan`, one per side: the
target's id and the behaviour history mean-pooled per behaviour feature, the user's id, the
declared user and context features (`field_order`), looked up by DIN's code. The
model stays in this module, free of lambdas and closures, because ``paddle.jit.save`` reads
the source of ``forward`` from a real file.
"""

from __future__ import annotations

from collections.abc import Mapping

import paddle
from paddle import nn

from streamrec.config import ModelConfig
from streamrec.errors import ConfigError
from streamrec.learner.embedding import WideArch
from streamrec.learner.features import FeaturePlan, PlannedFeature
from streamrec.learner.model import TableModel, _mlp


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


def field_order(plan: FeaturePlan) -> list[tuple[int, bool]]:
    """DeepFM's fields as (index into `FeaturePlan.inputs`, along the history?), in its order.

    The built-in behaviour features' target and history, feature by feature, then the
    built-in user's, then the declared features' by side (the targets', the histories', the
    user and context features'). The deep part's first layer reads the fields in this order
    (state layout 1 onwards: `streamrec.learner.state.STATE_LAYOUT`).
    """
    nq, ns = len(plan.query), len(plan.sequence)
    builtin = [(i, False) for i in range(nq) if plan.query[i].builtin]
    builtin = [side for i, _ in builtin for side in ((i, False), (nq + i, True))]
    builtin += [(nq + ns + i, False) for i in range(len(plan.head)) if plan.head[i].builtin]
    declared = [
        *((i, False) for i in range(nq) if not plan.query[i].builtin),
        *((nq + i, True) for i in range(ns) if not plan.sequence[i].builtin),
        *((nq + ns + i, False) for i in range(len(plan.head)) if not plan.head[i].builtin),
    ]
    return builtin + declared


class DeepFM(TableModel):
    """DeepFM. B: batch, T: sequence length, F: fields, D: embedding dim (one for every table).

    Inputs as `streamrec.learner.model.DIN`'s, so both train from one `EncodedColumns` and
    export through one scoring graph: every feature's, in `FeaturePlan` order, and ``dense``
    float32 [B, S] (the id statistics, S may be 0). The output is [B] click logits.

    Fields (F = 2 * behaviour tables + context tables + the declared features' sides): each
    behaviour table's target vector, its history mean-pooled (a user without history: zeros),
    each context table's vector. First order: each id's learned weight (the history's
    mean-pooled) and, with id statistics, a linear term over them that starts as DIN's does
    (the item's and the user's positive rate log-odds with weight 1). With
    ``cfg.match_features`` DIN's `MatchArch` features (the target's share and count in its own
    history, per behaviour table) are numeric fields too: inputs of the deep part and a linear
    term of the logit, as in DIN.

    Declared features are fields as the built-in ones are (one function, `_field`): a
    behaviour feature's target value and its history's mean (an outcome: the history's only),
    a user or context feature's value. An ``id`` (or a ``bucket`` number) is
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
        rows = self._build_inputs(cfg, sparse, rows, plan)
        dims = sorted({d for _, d in self.plan.tables.values()})
        if len(dims) != 1:
            raise ConfigError(
                f"STREAMREC_MODEL__TABLES: DeepFM needs one embedding dim for every table (the declared "
                f"features' too), got {dims}"
            )
        self.dim = dims[0]
        self.embedding.distinct = False  # a lookup per position, as DeepFM always had
        self.wide = WideArch(cfg, sparse, rows, list(self.plan.tables))
        self.interaction = FMInteraction()
        self.number_names = number_fields(self.plan)
        # Only with declared numbers, so a model without keeps its state's layout.
        self.numbers = (
            nn.LayerDict({n: NumberField(dims[0]) for n in self.number_names}) if self.number_names else None
        )
        self.sides = field_order(self.plan)
        fields = sum(self.plan.inputs[i][0].table is not None for i, _ in self.sides)
        counters = self._build_counters(cfg)
        self.dnn = DNNArch(fields * dims[0] + counters + len(self.number_names), cfg.mlp_units)

    def forward(self, inputs: list[paddle.Tensor], dense: paddle.Tensor) -> paddle.Tensor:
        """Score each target; returns [B] logits."""
        mask, counters, matches = self._open(inputs, dense)
        length = paddle.clip(mask.sum(axis=1), min=1.0).unsqueeze(-1)
        fields: list[paddle.Tensor] = []
        first: list[paddle.Tensor] = []
        values: list[paddle.Tensor] = []
        features = self.x_query + self.x_sequence + self.x_head
        # Indexing, not zip(strict=True): paddle.jit's tracer (the serving export) lacks it.
        for j in range(len(self.sides)):
            index, history = self.sides[j]
            self._field(features[index], inputs[index], history, mask, length, fields, first, values)
        stacked = paddle.stack(fields, axis=1)
        deep = [paddle.flatten(stacked, start_axis=1), *counters]
        if values:
            deep.append(paddle.stack(values, axis=1))
        interacting = stacked
        if self.numbers is not None and values:
            interacting = paddle.concat([stacked, self._number_vectors(self.numbers, values, first)], axis=1)
        logits = paddle.add_n(first) + self.interaction(interacting) + self.dnn(paddle.concat(deep, axis=-1))
        return self._close(logits, dense, matches)

    def _field(
        self,
        f: PlannedFeature,
        x: paddle.Tensor,
        history: bool,
        mask: paddle.Tensor,
        length: paddle.Tensor,
        fields: list[paddle.Tensor],
        first: list[paddle.Tensor],
        values: list[paddle.Tensor],
    ) -> None:
        """Append one side of one feature: its field and first-order term, or a number's value ([B]).

        A value a sample has: [B] (ids: [B, M]); ``history``: along its behaviours, [B, T]
        (ids: [B, T, M]), mean-pooled over the real ones (``mask`` [B, T], ``length`` [B, 1]).
        """
        if f.table is None:
            values.append((x * mask).sum(axis=1) / length.squeeze(-1) if history else x)
            return
        vectors = self.embedding.lookup(f, x)
        bias = self.wide.bias(f, x)
        if history:
            fields.append((vectors * mask.unsqueeze(-1)).sum(axis=1) / length)
            first.append((bias * mask).sum(axis=1) / length.squeeze(-1))
        else:
            fields.append(vectors)
            first.append(bias)

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
