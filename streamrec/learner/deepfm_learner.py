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

import paddle

from streamrec.config import ModelConfig
from streamrec.features import FeatureSchema
from streamrec.learner.deepfm import DeepFM
from streamrec.learner.features import FeaturePlan
from streamrec.learner.trainer import SPARSE_EMBEDDINGS, TableLearner


class DeepFMLearner(TableLearner):
    """Trains and scores a DeepFM on micro-batches; its whole state round-trips as numpy arrays.

    Examples:
        >>> from streamrec.config import ModelConfig, TableConfig
        >>> from streamrec.learner.batch import Batch
        >>> from streamrec.samples import Sample
        >>> cfg = ModelConfig(
        ...     learner="deepfm", tables=(TableConfig(name="item", feature="item", rows=64, dim=4),),
        ...     mlp_units=(8,), device="cpu",
        ... )
        >>> learner = DeepFMLearner(cfg)
        >>> batch = Batch.from_samples([
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
