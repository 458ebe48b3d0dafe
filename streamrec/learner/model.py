"""Deep Interest Network (Zhou et al., KDD 2018) in ``paddle.nn``, built from named parts.

``DIN`` = ``EmbeddingArch`` (every table of its `FeaturePlan`) + ``LocalActivationUnit``
(target-aware attention over the behaviour sequence) + ``MLPHead`` (the click predictor).
``TableModel`` is what DIN and DeepFM (`streamrec.learner.deepfm`) build and read alike: their
inputs and the id counters' terms. ``ClickTrain`` owns the loss (for DeepFM too). The model
stays in this module, free of lambdas and closures, because ``paddle.jit.save`` reads the
source of ``forward`` (and of what it calls) from a real file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn

from streamrec.config import ModelConfig
from streamrec.features import FeatureSchema
from streamrec.learner import embedding, numpy_attention
from streamrec.learner.embedding import EmbeddingArch, WideArch, distinct_keys
from streamrec.learner.features import FeaturePlan, PlannedFeature
from streamrec.learner.hashing import PADDING_BUCKET
from streamrec.learner.idmap import DEFAULT_ROW
from streamrec.learner.onnxforms import attention_first_layer_broadcast, prelu_linear_row, prelu_slope


def _mlp(in_dim: int, units: Sequence[int], zero_out: bool = False) -> nn.Sequential:
    """Linear + PReLU blocks and a final one-unit Linear, on [N, C] inputs.

    PReLU is the DIN paper's baseline activation (Dice's ancestor). ``zero_out`` starts the
    final layer at zero, so the MLP adds nothing until it has learnt.
    """
    layers: list[nn.Layer] = []
    for width in units:
        prelu = nn.PReLU(num_parameters=width, data_format="NC")
        layers.extend([nn.Linear(in_dim, width), prelu])
        in_dim = width
    zero = paddle.ParamAttr(initializer=nn.initializer.Constant(0.0)) if zero_out else None
    layers.append(nn.Linear(in_dim, 1, weight_attr=zero, bias_attr=zero))
    return nn.Sequential(*layers)


def prelu_linear(x: paddle.Tensor, prelu: nn.Layer, linear: nn.Layer) -> paddle.Tensor:
    """``linear(prelu(x))`` on [N, C] rows, without Paddle's PReLU kernels.

    With PReLU's per-channel slope a, prelu(x) = (1 - a) * relu(x) + a * x, so
    prelu(x) W + b = relu(x) (diag(1 - a) W) + x (diag(a) W) + b: the slope moves into two
    [C, H] weights (tiny) and the rows see a relu and two matmuls. The same function and the
    same parameters; on CPU Paddle's PReLU forward and backward cost ~5x a relu, and they were
    the largest item of a training step (docs/concepts/model.md, "Cost").
    """
    slope = prelu_slope(prelu).unsqueeze(-1)
    w = linear.weight
    return paddle.matmul(F.relu(x), (1.0 - slope) * w) + F.linear(x, slope * w, linear.bias)


def mlp_tail(layers: Sequence[nn.Layer], hidden: paddle.Tensor) -> paddle.Tensor:
    """Run an `_mlp`'s layers after its first Linear, (PReLU, Linear) pairs, on [N, C] rows."""
    for i in range(0, len(layers), 2):
        hidden = prelu_linear(hidden, layers[i], layers[i + 1])
    return hidden


def attention_first_layer(first: nn.Layer, query: paddle.Tensor, keys: paddle.Tensor) -> paddle.Tensor:
    """DIN attention's first layer on [q, k, q-k, q*k], without building that input: [B, T, H].

    ``query`` is [B, D]; ``keys`` [B, T, D + 1], the behaviour vectors with a ones column,
    which picks up the q term and the bias (`first_layer_per_sample`'s last row) in the bmm.
    """
    return paddle.bmm(keys, first_layer_per_sample(first, query))


def first_layer_per_sample(first: nn.Layer, query: paddle.Tensor) -> paddle.Tensor:
    """The attention's first layer as per-sample weights on the keys: [B, D + 1, H].

    ``query`` is [B, D]; the keys (`attention_first_layer`) are [B, T, D + 1].

    Split by the weight's row blocks W1..W4 (each [D, H]):
    [q, k, q-k, q*k] W + b = k (W2 - W3 + diag(q) W4) + (q (W1 + W3) + b). Both brackets are
    per sample ([B, D, H] and [B, H]), so the behaviours see one batched matmul and one add:
    the q term is computed once per sample, not once per behaviour, and neither the
    [B, T, 4D] input nor the [B, T, D] product q*k is built. The same function and parameters
    as the layer on the concatenation (the state and snapshots are unchanged).
    """
    d, h = query.shape[-1], first.weight.shape[1]
    w = first.weight
    # Both brackets as one matmul, [1, q] x R -> [B, (D + 1) * H], read as [B, D + 1, H]:
    # R's first row holds W2 - W3 (then b), row 1 + i holds W4's row i in columns
    # i*H..(i+1)*H (then W1 + W3's row i), zeros elsewhere. Built from [D, H] weights only
    # (tiny); no [B, D, H] or [B, T, H] tensor is broadcast, expanded or reduced.
    blocks = (paddle.eye(d, dtype=w.dtype).unsqueeze(-1) * w[3 * d :].unsqueeze(0)).reshape([d, d * h])
    keys_part = paddle.concat([(w[d : 2 * d] - w[2 * d : 3 * d]).reshape([1, d * h]), blocks], axis=0)
    query_part = paddle.concat([first.bias.unsqueeze(0), w[:d] + w[2 * d : 3 * d]], axis=0)
    right = paddle.concat([keys_part, query_part], axis=1)
    ones = paddle.ones_like(query[:, :1])
    return paddle.matmul(paddle.concat([ones, query], axis=-1), right).reshape([-1, d + 1, h])


class LocalActivationUnit(nn.Layer):
    """DIN attention: one weight per behaviour from [q, k, q-k, q*k], then a weighted sum.

    As in the paper the weights are not softmax-normalised, so the pooled vector's size keeps
    how strongly the history relates to the target. Padding positions get weight 0.
    """

    def __init__(self, dim: int, units: Sequence[int]) -> None:
        """Build the scoring MLP.

        Args:
            dim: Size of the query and key vectors (D).
            units: Hidden widths of the scoring MLP (``cfg.attention_units``).
        """
        super().__init__()
        self.score = _mlp(4 * dim, units)
        self.onnx_form = False  # the export's ONNX graph is traced with it on (learner.onnxforms)

    def forward(
        self, query: paddle.Tensor, keys: paddle.Tensor, mask: paddle.Tensor
    ) -> tuple[paddle.Tensor, paddle.Tensor]:
        """Pool the keys by their relevance to the query, and plainly.

        Args:
            query: [B, D] target vectors.
            keys: [B, T, D + 1] behaviour vectors, each with a last column of ones (it carries
                the first layer's per-sample term; see `attention_first_layer`).
            mask: [B, T] float, 1 for a real behaviour and 0 for padding.

        Returns:
            [B, D] the user-interest vector, and [B, D] the plain sum of the real behaviours.
        """
        layers = list(self.score)
        if self.onnx_form:
            hidden = attention_first_layer_broadcast(layers[0], query, keys)
            hidden = mlp_tail(layers[1:-2], hidden.reshape([-1, hidden.shape[-1]]))
            weights = prelu_linear_row(hidden, layers[-2], layers[-1]).reshape(mask.shape)
        elif numpy_attention.usable(keys):
            interest, plain = paddle.unbind(numpy_attention.pooled_history(query, keys, mask, layers), axis=1)
            return interest, plain
        else:
            hidden = attention_first_layer(layers[0], query, keys)
            # The rest runs on [B*T, H] rows, which oneDNN (the exported model's CPU kernels)
            # reads right where it mis-reads [B, T, H].
            weights = mlp_tail(layers[1:], hidden.reshape([-1, hidden.shape[-1]])).reshape(mask.shape)
        # Both sums as one batched matmul, [B, 2, T] x [B, T, D + 1] (the ones column dropped).
        sums = paddle.bmm(paddle.stack([weights * mask, mask], axis=1), keys)
        d = query.shape[-1]
        return sums[:, 0, :d], sums[:, 1, :d]


class MatchArch(nn.Layer):
    """Explicit match features between the target and its own history, per behaviour table.

    The share of the history's behaviours on the target's row, and log(1 + their count).

    A user's history in the target's category (or the target itself in it) tells more than
    any counter, but attention and an MLP starting at zero learn "same id" slowly; so it is
    stated. The features are computed in the graph from the history given only (never a
    sample's own event), so the export computes them from the same rows. Padding matches
    nothing, nor does a dynamic table's default row (ids not yet admitted all share it). They
    feed the head and enter the logit with a learned weight per feature, starting at zero (a
    share's at ``init``) and learning ``lr_scale`` times faster than the rest. Nb: behaviour
    tables.
    """

    def __init__(self, floors: Sequence[int], lr_scale: float, init: float = 0.0) -> None:
        """One weight per feature (2 per behaviour table).

        Args:
            floors: Per behaviour table, the highest row that matches nothing (padding, or a
                dynamic table's default row).
            lr_scale: The weights' learning rate over the model's.
            init: Each table's share feature's starting weight (the counts' start at zero).
        """
        super().__init__()
        self.floors = [int(f) for f in floors]
        self.width = 2 * len(self.floors)
        start = np.array([init, 0.0] * len(self.floors), dtype=np.float32)
        attr = paddle.ParamAttr(initializer=nn.initializer.Assign(start), learning_rate=lr_scale)
        self.weight = self.create_parameter([self.width], attr=attr)

    def features(
        self, targets: list[paddle.Tensor], sequences: list[paddle.Tensor], mask: paddle.Tensor
    ) -> paddle.Tensor:
        """[B, 2*Nb].

        Per table, share and log1p(count) of the [B, T] ``sequences`` rows equal to the [B]
        ``targets`` row; ``mask`` [B, T] marks the real behaviours.
        """
        length = paddle.clip(mask.sum(axis=1), min=1.0)
        columns: list[paddle.Tensor] = []
        for i in range(len(targets)):
            known = (targets[i] > self.floors[i]).astype(mask.dtype).unsqueeze(-1)
            same = (sequences[i] == targets[i].unsqueeze(-1)).astype(mask.dtype)
            count = (same * known * mask).sum(axis=1)
            columns += [count / length, paddle.log1p(count)]
        return paddle.stack(columns, axis=1)

    def forward(self, features: paddle.Tensor) -> paddle.Tensor:
        """[B] the features' term of the logit."""
        return (features * self.weight).sum(axis=-1)


class MLPHead(nn.Layer):
    """The click predictor over concat(target, interest, sum-pooled sequence, context) → one logit."""

    def __init__(self, dim: int, context_dim: int, units: Sequence[int]) -> None:
        """Build the MLP.

        Args:
            dim: Size of the target, interest and pooled vectors (the behaviour width).
            context_dim: Size of the context vector (0 without context tables).
            units: Hidden widths (``cfg.mlp_units``).
        """
        super().__init__()
        self.mlp = _mlp(3 * dim + context_dim, units, zero_out=True)
        self.onnx_form = False  # the export's ONNX graph is traced with it on (learner.onnxforms)

    def forward(self, features: Sequence[paddle.Tensor]) -> paddle.Tensor:
        """Map the [B, *] feature vectors, concatenated in order, to [B] logits."""
        layers = list(self.mlp)
        hidden = layers[0](paddle.concat(list(features), axis=-1))
        if self.onnx_form:
            return prelu_linear_row(mlp_tail(layers[1:-2], hidden), layers[-2], layers[-1])
        return mlp_tail(layers[1:], hidden).squeeze(-1)


class TableModel(nn.Layer):
    """What every table model (DIN, DeepFM) builds and reads alike: its inputs and its id counters.

    B: batch, T: sequence length, Nb: the built-in behaviour features (item, category). The
    inputs: every table (`EmbeddingArch`) and every feature by side, in `FeaturePlan` order
    (``x_query``, ``x_sequence``, ``x_head``): ``forward`` takes one input per
    `FeaturePlan.keys` entry. The counters, over the built-in behaviour features: the
    ``dense`` [B, 2 * Nb + 2] id statistics (``cfg.id_stats``; the rates enter the logit
    through ``prior``) and `MatchArch` (``cfg.match_features``). A model builds its own parts
    between `_build_inputs` and `_build_counters` (the order keeps its seeded start); its
    ``forward`` opens with `_open` and closes with `_close`.
    """

    def _build_inputs(
        self, cfg: ModelConfig, sparse: bool, rows: Mapping[str, int] | None, plan: FeaturePlan | None
    ) -> Mapping[str, int]:
        """Build the tables, take the features' sides; returns the tables' rows (default: start).

        ``plan`` None: the default schema's.
        """
        self.plan = FeaturePlan(cfg, FeatureSchema.default()) if plan is None else plan
        rows = {**self.plan.start_rows, **({} if rows is None else rows)}
        self.embedding = EmbeddingArch(self.plan, sparse, rows)
        self.x_query = list(self.plan.query)
        self.x_sequence = list(self.plan.sequence)
        self.x_head = list(self.plan.head)
        # The built-in behaviour features' places in x_query (and x_sequence): the counters'.
        self.counted = [i for i in range(len(self.x_query)) if self.x_query[i].builtin]
        return rows

    def _build_counters(self, cfg: ModelConfig) -> int:
        """Build the prior and the match features; returns the columns they add to the deep input."""
        n_behaviour = len(self.counted)
        # Rate and count per behaviour table, then the user's (see learner.idstats).
        self.dense_dim = 2 * n_behaviour + 2 if cfg.id_stats else 0
        if self.dense_dim:
            # The first behaviour table's rate log-odds and the user's (centred) enter the
            # logit with weight 1: the model starts as a counter of item and user rates and
            # learns what it adds to them.
            start = [1.0] + [0.0] * (n_behaviour - 1) + [1.0]
            self.prior = self.create_parameter(
                [len(start)], default_initializer=nn.initializer.Assign(np.array(start, dtype=np.float32))
            )
        tables = [self.x_query[i].table for i in self.counted]
        floors = [DEFAULT_ROW if t in self.plan.dynamic else PADDING_BUCKET for t in tables]
        self.match = MatchArch(floors, cfg.match_lr_scale, cfg.match_init) if cfg.match_features else None
        return self.dense_dim + (self.match.width if self.match is not None else 0)

    def _open(
        self, inputs: list[paddle.Tensor], dense: paddle.Tensor
    ) -> tuple[paddle.Tensor, list[paddle.Tensor], paddle.Tensor | None]:
        """The opening of ``forward``: the mask, the counters' deep inputs, the match features.

        The [B, T] float mask is 1 for a real behaviour (the first behaviour feature's rows,
        a built-in's, are not padding); the deep inputs are the id statistics and the
        [B, 2 * Nb] match features, those there are (the latter alone: None without).
        """
        nq = len(self.x_query)
        mask = (inputs[nq] != PADDING_BUCKET).astype("float32")
        targets: list[paddle.Tensor] = []
        sequences: list[paddle.Tensor] = []
        for j in range(len(self.counted)):
            targets.append(inputs[self.counted[j]])
            sequences.append(inputs[nq + self.counted[j]])
        counters = [dense] if self.dense_dim else []
        matches = self.match.features(targets, sequences, mask) if self.match is not None else None
        if matches is not None:
            counters.append(matches)
        return mask, counters, matches

    def _close(
        self, logits: paddle.Tensor, dense: paddle.Tensor, matches: paddle.Tensor | None
    ) -> paddle.Tensor:
        """The [B] ``logits`` with the counters' terms: the match features' and the prior's."""
        if self.match is not None and matches is not None:
            logits = logits + self.match(matches)
        if self.dense_dim:
            logits = logits + (dense[:, 0::2] * self.prior).sum(axis=-1)
        return logits


def biased(feature: PlannedFeature) -> bool:
    """Whether DIN's wide part has a bias per id of target ``feature``: a behaviour feature of ids.

    The built-ins (item, category) and the declared ``id`` and ``ids`` ones (an ``ids``
    value: its ids' biases' mean). Not a number, bucketed or not. Declared: measured on
    MovieLens, the genres' biases add GAUC 0.0019-0.0023 at seeds 0, 1 and 2 (first quarter
    0.0027-0.0029; ``bench/HISTORY.md``), a genre's rate learnt directly as the item's is.
    """
    return feature.query and feature.table is not None and (feature.builtin or feature.spec.kind != "number")


class DIN(TableModel):
    """Deep Interest Network. B: batch, T: sequence length, M: a feature's max_ids.

    D: width of a behaviour vector = the behaviour features' widths (Dq: the target's own,
    item and category first) + the outcome features' (Do), in that order.

    ``inputs`` are every feature's, in `FeaturePlan` order (`FeaturePlan.keys`): the
    target's per ``plan.query`` feature, along the sequence per ``plan.sequence`` feature,
    then per ``plan.head`` feature (an id: int64 [B] / [B, T] rows, 0 for padding; ids:
    [B, M] / [B, T, M]; a number: float32 [B] / [B, T], transformed); ``dense`` float32
    [B, F]. The output is [B] click logits.

    A declared behaviour feature is embedded for the target and each behaviour and
    concatenated into their vectors, as the paper concatenates goods, shop and category. An
    outcome (a rating) belongs to a behaviour only: its columns of the target (query) vector
    are zeros, so attention reads it in the keys (k and q-k; q*k is 0 there) and the pooled
    interest carries it, with one attention unit and no second projection. User and context
    features go into the head beside the user table's vector.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        sparse: bool = True,
        rows: Mapping[str, int] | None = None,
        plan: FeaturePlan | None = None,
    ) -> None:
        """Build the three parts from ``cfg``.

        Args:
            cfg: The model hyper-parameters.
            sparse: Sparse embedding gradients (see ``EmbeddingArch``).
            rows: Each table's rows; default: the rows it starts with.
            plan: The declared features (none: the default schema).
        """
        super().__init__()
        rows = self._build_inputs(cfg, sparse, rows, plan)
        self.outcome_width = self.plan.outcome_width
        dim = self.plan.query_width + self.outcome_width
        self.attention = LocalActivationUnit(dim, cfg.attention_units)
        counters = self._build_counters(cfg)
        self.head = MLPHead(dim, self.plan.head_width + counters, cfg.mlp_units)
        # The wide part reads the targets of the built-in behaviour features (the counters') and of
        # the declared ones with ids (`biased`), and the user's, by input.
        self.wide_inputs = [i for i in range(len(self.x_query)) if biased(self.x_query[i])]
        start = len(self.x_query) + len(self.x_sequence)
        self.wide_inputs += [start + i for i in range(len(self.x_head)) if self.x_head[i].builtin]
        self.wide_features = [self.plan.inputs[i][0] for i in self.wide_inputs]
        tables = [name for name in self.plan.tables if any(f.table == name for f in self.wide_features)]
        self.wide = WideArch(cfg, sparse, rows, tables) if cfg.wide else None
        query, sequence = self.x_query, self.x_sequence
        # Whether the plan lets `distinct_keys` build the target and keys: the target's and the
        # sequence's features are the built-in ids of the same tables, in the same order (no
        # declared behaviour or outcome features).
        self._plain_keys = (
            not self.outcome_width
            and len(query) == len(sequence)
            and all(
                query[i].builtin and query[i].table is not None and query[i].table == sequence[i].table
                for i in range(len(query))
            )
            and not any(f.pooled for f in (*query, *sequence))
        )

    def forward(self, inputs: list[paddle.Tensor], dense: paddle.Tensor) -> paddle.Tensor:
        """Score each target against its user's behaviour sequence; returns [B] logits."""
        nq, ns = len(self.x_query), len(self.x_sequence)
        mask, counters, matches = self._open(inputs, dense)
        if self._distinct_keys(inputs[0]):
            tables = [self.embedding.tables[str(self.x_query[i].table)] for i in range(nq)]
            target, keys = distinct_keys(tables, inputs[:nq], inputs[nq : nq + ns])
        else:
            # Indexing, not zip(strict=True): paddle.jit's tracer (the serving export) lacks it.
            query: list[paddle.Tensor] = []
            for i in range(nq):
                query.append(self.embedding.lookup(self.x_query[i], inputs[i]))
            if self.outcome_width:
                # An outcome's columns of the target vector are zeros (see the class docstring).
                query.append(paddle.tile(paddle.zeros_like(query[0][:, :1]), [1, self.outcome_width]))
            target = paddle.concat(query, axis=-1)
            along: list[paddle.Tensor] = []
            for i in range(ns):
                along.append(self.embedding.lookup(self.x_sequence[i], inputs[nq + i]))
            # One concatenation builds the keys, with the attention's ones column last.
            keys = paddle.concat([*along, paddle.ones_like(mask).unsqueeze(-1)], axis=-1)
        interest, pooled = self.attention(target, keys, mask)
        features = [target, interest, pooled]
        for i in range(len(self.x_head)):
            features.append(self.embedding.lookup(self.x_head[i], inputs[nq + ns + i]))
        features.extend(counters)
        logits = self._close(self.head(features), dense, matches)
        if self.wide is not None:
            biases: list[paddle.Tensor] = []
            for j in range(len(self.wide_inputs)):
                biases.append(self.wide.bias(self.wide_features[j], inputs[self.wide_inputs[j]]))
            logits = logits + paddle.add_n(biases)
        return logits

    def _distinct_keys(self, ids: paddle.Tensor) -> bool:
        """Whether the forward builds its target and keys by `distinct_keys`.

        On the CPU, training and scoring alike (the same values); not while a graph is traced
        (the export), which has no numpy; and only when the target's and the sequence's
        features are the built-in ids of the same tables, in the same order (no declared
        behaviour or outcome features).
        """
        if not (self._plain_keys and self.embedding.distinct and embedding.DISTINCT_LOOKUPS):
            return False
        return paddle.in_dynamic_mode() and ids.place.is_cpu_place()


class ClickTrain(nn.Layer):
    """The training wrapper of any table model (DIN, DeepFM): mean binary cross-entropy on its logits.

    Online EWC's penalty is added by the learner, after the data loss's gradients fed its
    Fisher estimate.
    """

    def __init__(self, model: nn.Layer) -> None:
        """Wrap ``model``."""
        super().__init__()
        self.model = model

    def forward(
        self, inputs: list[paddle.Tensor], dense: paddle.Tensor, label: paddle.Tensor
    ) -> paddle.Tensor:
        """The scalar training loss for one mini-batch (inputs as the model's); ``label`` float32 [B]."""
        logits = self.model(inputs, dense)
        return F.binary_cross_entropy_with_logits(logits, label)
