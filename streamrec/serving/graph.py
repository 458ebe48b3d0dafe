"""The exported scoring graph: a table model (DIN, DeepFM) with its id statistics inside.

Serving feeds rows.

``paddle.jit.save`` traces ``forward`` from this file's source, so the graph stays free of
lambdas and closures. The id statistics (`streamrec.learner.idstats`) become constant
tensors of the graph: a serving process turns raw ids into rows (the export's id tables) and
needs nothing else from the learner.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn

from streamrec.learner.features import FeaturePlan
from streamrec.learner.idstats import PRIOR_SAMPLES, RATE_EPS, USER, log_odds


def input_order(plan: FeaturePlan) -> list[int]:
    """Where each of the model's inputs (`FeaturePlan.inputs`) is among the contract's.

    The contract's, in a row: the built-in behaviour features' target rows (its ``targets``
    columns), their sequences (``sequences``), the built-in user's rows (``context``), then
    the declared features' inputs (`FeaturePlan.input_keys`).
    """
    behaviour = [f.name for f in plan.query if f.builtin]
    context = [f.name for f in plan.head if f.builtin]
    declared = plan.input_keys
    nb, nc = len(behaviour), len(context)
    order = []
    for f, side in plan.inputs:
        if not f.builtin:
            order.append(2 * nb + nc + declared.index(f"{f.name}/{side}"))
        elif f.name in context:
            order.append(2 * nb + context.index(f.name))
        else:
            order.append(behaviour.index(f.name) + (nb if side == "sequence" else 0))
    return order


class ScoringGraph(nn.Layer):
    """Click probabilities from table rows. B: candidates, Nb: behaviour tables, T: sequence length.

    Inputs: ``targets`` int64 [B, Nb], ``sequences`` int64 [B, Nb, T] (right-aligned, 0 for
    padding), ``users`` int64 [B] (the user's statistics bucket). Output: float32 [B].
    """

    def __init__(
        self,
        model: nn.Layer,
        behaviour: list[str],
        samples: Mapping[str, np.ndarray] | None,
        positives: Mapping[str, np.ndarray] | None,
    ) -> None:
        """Wrap a trained ``model``.

        ``samples``/``positives`` are the id statistics' counts per behaviour table and ``user``
        (None when the model reads no statistics).
        """
        super().__init__()
        self.model = model
        self.n_behaviour = len(behaviour)
        self.order = input_order(model.plan)
        self.stats = samples is not None and positives is not None
        self._names = [*behaviour, USER]
        if samples is not None and positives is not None:
            arrays = self._stat_arrays(samples, positives)
            self.counts = nn.ParameterList([self._constant(a) for a in arrays[1:]])
            self.priors = self._constant(arrays[0])  # [the users' click rate, its log-odds]

    def _stat_arrays(
        self, samples: Mapping[str, np.ndarray], positives: Mapping[str, np.ndarray]
    ) -> list[np.ndarray]:
        """The priors, then each table's sample counts and positive counts (the graph's constants)."""
        total = float(samples[USER].sum())
        prior = float(positives[USER].sum()) / total if total else 0.5
        priors = np.array([prior, log_odds(np.float64(prior))], np.float32)
        return [priors, *(samples[n] for n in self._names), *(positives[n] for n in self._names)]

    def set_stats(
        self, samples: Mapping[str, np.ndarray] | None, positives: Mapping[str, np.ndarray] | None
    ) -> None:
        """Take other id statistics of the same shapes (a graph traced once, saved again).

        Raises:
            ValueError: the statistics are not of this graph's shapes, or present where it has none.
        """
        if (samples is None or positives is None) != (not self.stats):
            raise ValueError("id statistics given to a graph built without them, or the other way")
        if samples is None or positives is None:
            return
        arrays = self._stat_arrays(samples, positives)
        for param, array in zip([self.priors, *self.counts], arrays, strict=True):
            if tuple(param.shape) != array.shape:
                raise ValueError(f"id statistics of shape {array.shape} for a graph of {tuple(param.shape)}")
            param.set_value(np.asarray(array, np.float32))

    def _constant(self, array: np.ndarray) -> paddle.Tensor:
        param = self.create_parameter(
            list(array.shape), dtype="float32", default_initializer=nn.initializer.Assign(array)
        )
        param.stop_gradient = True
        return param

    def _rate_and_count(self, index: int, rows: paddle.Tensor) -> list[paddle.Tensor]:
        n = paddle.gather(self.counts[index], rows)
        pos = paddle.gather(self.counts[index + self.n_behaviour + 1], rows)
        rate = (pos + PRIOR_SAMPLES * self.priors[0]) / (n + PRIOR_SAMPLES)
        rate = paddle.clip(rate, RATE_EPS, 1 - RATE_EPS)  # as idstats.log_odds
        return [paddle.log(rate / (1 - rate)), paddle.log1p(n)]

    def _dense(self, targets: paddle.Tensor, users: paddle.Tensor) -> paddle.Tensor:
        columns: list[paddle.Tensor] = []
        for i in range(self.n_behaviour):
            columns += self._rate_and_count(i, targets[:, i])
        rate, count = self._rate_and_count(self.n_behaviour, users)
        columns += [rate - self.priors[1], count]
        return paddle.stack(columns, axis=1)

    def score(
        self,
        targets: paddle.Tensor,
        sequences: paddle.Tensor,
        users: paddle.Tensor,
        context: list[paddle.Tensor],
        extras: list[paddle.Tensor] | None = None,
    ) -> paddle.Tensor:
        """[B] probabilities.

        ``context`` holds one [B] row tensor per context table, ``extras`` the declared
        features' inputs (see `DIN`).
        """
        # The contract's inputs as the model's, in `FeaturePlan` order (`input_order`).
        pool = [targets[:, i] for i in range(self.n_behaviour)]
        pool.extend([sequences[:, i, :] for i in range(self.n_behaviour)])
        pool.extend(context)
        if extras:
            pool.extend(extras)
        inputs = []
        for i in range(len(self.order)):
            inputs.append(pool[self.order[i]])
        if self.stats:
            logits = self.model(inputs, self._dense(targets, users))
        else:
            # The contract keeps one list of inputs: without statistics ``users`` is read as a
            # zero term (an input the graph does not use cannot be exported).
            unused = targets.astype("float32")  # a model without statistics ignores dense
            logits = self.model(inputs, unused)
            logits = logits + 0.0 * users.astype("float32")
        return F.sigmoid(logits)

    def forward(
        self, targets: paddle.Tensor, sequences: paddle.Tensor, users: paddle.Tensor
    ) -> paddle.Tensor:
        """[B] click probabilities (no context tables)."""
        return self.score(targets, sequences, users, [])


class ContextScoringGraph(ScoringGraph):
    """`ScoringGraph` with a fourth input, ``context`` int64 [B, Nc].

    A row per context table (a user table, say), in table order.
    """

    def forward(  # type: ignore[override]
        self, targets: paddle.Tensor, sequences: paddle.Tensor, users: paddle.Tensor, context: paddle.Tensor
    ) -> paddle.Tensor:
        """[B] click probabilities."""
        n_context = self.model.plan.n_context
        return self.score(targets, sequences, users, [context[:, i] for i in range(n_context)])


# Declared features (streamrec.learner.features): the graphs above with one more input per
# `FeaturePlan.input_keys` entry, last, as the contract lists them.


class FeatureScoringGraph(ScoringGraph):
    """`ScoringGraph` with the declared features' inputs, ``extras``, after ``users``."""

    def forward(  # type: ignore[override]
        self,
        targets: paddle.Tensor,
        sequences: paddle.Tensor,
        users: paddle.Tensor,
        extras: list[paddle.Tensor],
    ) -> paddle.Tensor:
        """[B] click probabilities (no context tables)."""
        return self.score(targets, sequences, users, [], extras)


class FeatureContextScoringGraph(ScoringGraph):
    """`ContextScoringGraph` with the declared features' inputs, ``extras``, after ``context``."""

    def forward(  # type: ignore[override]
        self,
        targets: paddle.Tensor,
        sequences: paddle.Tensor,
        users: paddle.Tensor,
        context: paddle.Tensor,
        extras: list[paddle.Tensor],
    ) -> paddle.Tensor:
        """[B] click probabilities."""
        n_context = self.model.plan.n_context
        return self.score(targets, sequences, users, [context[:, i] for i in range(n_context)], extras)
