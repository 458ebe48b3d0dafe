"""The DIN learner: a `TableLearner` over the Deep Interest Network (`streamrec.learner.model`).

`DINLearner` implements `Learner`.
"""

from __future__ import annotations

from collections.abc import Mapping

import paddle

from streamrec.features import FeatureSchema
from streamrec.learner.model import DIN
from streamrec.learner.state import EWC_PREFIX, FEATURES_PREFIX, OPTIMIZER_PREFIX, PARAM_PREFIX
from streamrec.learner.trainer import SPARSE_EMBEDDINGS, TableLearner, resolve_device

__all__ = [
    "EWC_PREFIX", "FEATURES_PREFIX", "OPTIMIZER_PREFIX", "PARAM_PREFIX", "DINLearner", "resolve_device"
]


class DINLearner(TableLearner):
    """Trains and scores a DIN on micro-batches; its whole state round-trips as numpy arrays.

    "Known" items are the item-table rows the learner has trained on (targets and
    behaviours); without an item table no item counts as known.

    Examples:
        A tiny model, scored before and after it trains on one micro-batch (prequential, as
        the learner loop does):

        >>> from streamrec.config import ModelConfig, TableConfig
        >>> from streamrec.learner.columns import SampleColumns
        >>> from streamrec.samples import Sample
        >>> cfg = ModelConfig(
        ...     tables=(TableConfig(name="item", feature="item", rows=64, dim=4),),
        ...     attention_units=(8,), mlp_units=(8,), device="cpu",
        ... )
        >>> learner = DINLearner(cfg)
        >>> batch = SampleColumns.from_samples([
        ...     Sample("e1", "u1", 1_700_000_000_000, "i1", "c1", 1, ("i2",), ("c1",)),
        ...     Sample("e1~n0", "u1", 1_700_000_000_000, "i3", "c2", 0, ("i2",), ("c1",)),
        ... ])
        >>> learner.predict_many(batch).shape, learner.is_known(batch)
        ((2,), array([False, False]))
        >>> result = learner.learn_many(batch)
        >>> result.steps, result.ids_admitted
        (1, {'item': 2})
        >>> for _ in range(20):
        ...     _ = learner.learn_many(batch)
        >>> scores = learner.predict_many(batch)
        >>> bool(scores[0] > scores[1])
        True

        Its whole state is named numpy arrays, which a snapshot stores:

        >>> state = learner.state_arrays()
        >>> DINLearner(cfg).load_state_arrays(state)
    """

    def _make_model(self, rows: Mapping[str, int]) -> paddle.nn.Layer:
        """A DIN over every table of the plan, freshly initialised."""
        return DIN(self.cfg, sparse=SPARSE_EMBEDDINGS, rows=rows, plan=self.plan)

    def _since(self, layout: int) -> tuple[str, ...]:
        """Before layout 3: the wide biases of the declared features (`streamrec.learner.model.biased`)."""
        return self._wide_biases(None) if layout < 3 else ()

    def _owned(self, added: list[str]) -> tuple[str, ...]:
        """The added features' tables, moments and wide biases."""
        return (*super()._owned(added), *self._wide_biases(added))

    def _wide_biases(self, names: list[str] | None) -> tuple[str, ...]:
        """What the keys of the wide biases of the declared features ``names`` (None: all) contain."""
        model = self.model
        assert isinstance(model, DIN)  # noqa: S101 -- _make_model builds it
        if model.wide is None:
            return ()
        declared = [f for f in model.wide_features if not f.builtin and (names is None or f.name in names)]
        return tuple(f"wide.biases.{f.table}." for f in declared)

    def _layouts(self, schema: FeatureSchema) -> dict[str, list[tuple[str, int]]]:
        """The input columns of the layers reading every feature, as (segment, width), under ``schema``."""
        model = self.model
        assert isinstance(model, DIN)  # noqa: S101 -- _make_model builds it
        known = [f for f in self.plan.declared if f.name in schema]
        query = [(f.name, f.width) for f in known if f.query]
        outcome = [(f.name, f.width) for f in known if f.spec.outcome]
        head = [(f.name, f.width) for f in known if f.spec.role != "behaviour"]
        builtin = sum(f.width for f in self.plan.query if f.builtin)
        vector = [("builtin", builtin), *query, *outcome]
        match = 0 if model.match is None else model.match.width
        return {
            "attention.score.0": [(f"{b}:{n}", w) for b in "qkdp" for n, w in vector],
            "head.mlp.0": [
                *((f"{b}:{n}", w) for b in "tip" for n, w in vector),
                ("context", sum(f.width for f in self.plan.head if f.builtin)), *head,
                ("dense", model.dense_dim), ("match", match),
            ],
        }
