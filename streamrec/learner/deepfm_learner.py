"""The DeepFM learner: a `TableLearner` over `streamrec.learner.deepfm.DeepFM`.

Chosen by ``STREAMREC_MODEL__LEARNER=deepfm``; it trains on the same micro-batches, keeps the
same state (id maps, Adam, EWC, id statistics) and exports through the same scoring graph
as DIN. Of the model settings it reads the tables, ``mlp_units`` (the deep part),
``id_stats``, ``wide_lr_scale`` (its first-order weights) and the training ones; DIN's
attention does not apply. It reads every declared feature (``STREAMREC_FEATURES``) as
fields of its own (see `DeepFM`), through DIN's `FeaturePlan` and encoding.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import paddle

from streamrec.config import ModelConfig
from streamrec.features import FeatureSchema
from streamrec.learner.deepfm import DeepFM
from streamrec.learner.features import FeaturePlan
from streamrec.learner.state import PARAM_PREFIX, STATE_LAYOUT
from streamrec.learner.trainer import SPARSE_EMBEDDINGS, TableLearner


class DeepFMLearner(TableLearner):
    """Trains and scores a DeepFM on micro-batches; its whole state round-trips as numpy arrays.

    Examples:
        >>> from streamrec.config import ModelConfig, TableConfig
        >>> from streamrec.learner.columns import SampleColumns
        >>> from streamrec.samples import Sample
        >>> cfg = ModelConfig(
        ...     learner="deepfm", tables=(TableConfig(name="item", feature="item", rows=64, dim=4),),
        ...     mlp_units=(8,), device="cpu",
        ... )
        >>> learner = DeepFMLearner(cfg)
        >>> batch = SampleColumns.from_samples([
        ...     Sample("e1", "u1", 1_700_000_000_000, "i1", "c1", 1, ("i2",), ("c1",)),
        ...     Sample("e1~n0", "u1", 1_700_000_000_000, "i3", "c2", 0, ("i2",), ("c1",)),
        ... ])
        >>> for _ in range(20):
        ...     _ = learner.learn_many(batch)
        >>> scores = learner.predict_many(batch)
        >>> bool(scores[0] > scores[1])
        True
    """

    # FM's first order reads the behaviours' per-id weights (mean-pooled) as well.
    WIDE_ALONG_SEQUENCE = True

    def _plan(self, cfg: ModelConfig, schema: FeatureSchema) -> FeaturePlan:
        """The declared features, their own tables as wide as the model's (FM needs one dim)."""
        dims = {t.dim for t in cfg.builtin_tables}
        return FeaturePlan(cfg, schema, dims.pop()) if len(dims) == 1 else FeaturePlan(cfg, schema)

    def _make_model(self, rows: Mapping[str, int]) -> paddle.nn.Layer:
        """A DeepFM over the tables, freshly initialised."""
        return DeepFM(self.cfg, sparse=SPARSE_EMBEDDINGS, rows=rows, plan=self.plan)

    def adopt_state(
        self, arrays: Mapping[str, np.ndarray], recorded: FeatureSchema, layout: int = STATE_LAYOUT
    ) -> dict[str, np.ndarray]:
        """State saved under ``recorded`` (fewer declared features) or an older ``layout``, made to fit.

        As DIN's (see `StateArrays.adopt_state`), and the added features' tables start at zero
        (numbers' vectors always do): FM's second order reads every pair of fields, so a new
        field's starting vector would move the scores. From zero they learn through the pairs
        (the other fields' vectors), and the model scores as before until they do.
        """
        out = super().adopt_state(arrays, recorded, layout)
        added = [n for n in self.schema.names if n not in recorded]
        tables = {self.plan.table_of(n) for n in added} - {None}
        for key in (f"{PARAM_PREFIX}model.embedding.tables.{t}.weight" for t in tables):
            out[key] = np.zeros_like(out[key])
        return out

    def _number_fields(self, names: list[str]) -> list[str]:
        """The model's number fields of the features ``names``."""
        model = self.model
        assert isinstance(model, DeepFM)  # noqa: S101 -- _make_model builds it
        return [n for n in model.number_names if n.split("__")[0] in names]

    def _owned(self, added: list[str]) -> tuple[str, ...]:
        """The added features' tables, moments, first-order weights and number fields."""
        tables = {self.plan.table_of(n) for n in added} - {None}
        return (
            *super()._owned(added),
            *(f"biases.{t}." for t in sorted(tables, key=str)),
            *(f"numbers.{n}." for n in self._number_fields(added)),
        )

    def _layouts(self, schema: FeatureSchema) -> dict[str, list[tuple[str, int]]]:
        """The deep part's input columns, as (segment, width), under ``schema``.

        The fields' vectors (the tables', then the declared features' in `FeaturePlan` order),
        the id statistics, the match features, then the declared numbers' values.
        """
        model = self.model
        assert isinstance(model, DeepFM)  # noqa: S101 -- _make_model builds it
        dim = model.dim
        sides = [("t", self.plan.query), ("s", self.plan.sequence), ("h", self.plan.head)]
        declared = [(side, f) for side, fs in sides for f in fs if not f.builtin]
        fields = [(f"{side}:{f.name}", dim) for side, f in declared if f.table and f.name in schema]
        numbers = [(n, 1) for n in model.number_names if n.split("__")[0] in schema]
        match = 0 if model.match is None else model.match.width
        builtin = sum(dim for side, fs in sides for f in fs if f.builtin)
        return {
            "dnn.mlp.0": [
                ("builtin", builtin),
                *fields,
                ("dense", model.dense_dim),
                ("match", match),
                *numbers,
            ],
        }
