"""DIN's wide part (``streamrec.learner.embedding.WideArch``) over declared behaviour features of ids.

A declared ``id`` or ``ids`` behaviour feature gets a bias per id, as item and category do
(an ``ids`` value: its ids' biases' mean); outcomes and numbers do not. The default schema's
model is unchanged (its seeded state and scores: ``test_keyed_digest.py``); an older state
of a declared-feature model migrates with the new biases at zero (``test_state_layout.py``).
"""

from __future__ import annotations

import numpy as np
import paddle

from streamrec.config import ModelConfig
from streamrec.features import FeatureSchema, FeatureSpec
from streamrec.learner.columns import SampleColumns
from streamrec.learner.din import DINLearner
from streamrec.learner.metrics import auc
from streamrec.learner.model import DIN
from streamrec.samples import Sample
from tests.support import small_tables

SCHEMA = FeatureSchema.of([
    FeatureSpec(name="genres", kind="ids", max_ids=3),
    FeatureSpec(name="shop"),
    FeatureSpec(name="year", kind="number", transform="standardize"),
    FeatureSpec(name="price", kind="number", transform="bucket", boundaries=(1.0, 10.0)),
    FeatureSpec(name="rating", kind="number", outcome=True),
    FeatureSpec(name="brand_seen", outcome=True),
    FeatureSpec(name="device", role="context"),
])
CFG = ModelConfig.model_validate({
    "tables": small_tables(256, 64, dim=4, ids="hashed"), "sequence_length": 4, "attention_units": (4,),
    "mlp_units": (4,), "device": "cpu", "learning_rate": 0.05,
})


def test_declared_behaviour_features_of_ids_have_wide_biases_outcomes_and_numbers_not() -> None:
    model = DINLearner(CFG, schema=SCHEMA).model
    assert isinstance(model, DIN) and model.wide is not None
    assert [f.name for f in model.wide_features] == ["item", "category", "genres", "shop"]
    assert sorted(model.wide.biases) == ["category", "genres", "item", "shop"]
    default = DINLearner(CFG).model
    assert isinstance(default, DIN) and default.wide is not None
    assert [f.name for f in default.wide_features] == ["item", "category"]


def _batch(label_of: dict[str, int], n: int, seed: int) -> SampleColumns:
    rng = np.random.default_rng(seed)
    samples = []
    for k in range(n):
        genre = str(rng.choice(list(label_of)))
        samples.append(Sample(
            f"s{seed}-{k}", f"u{k % 20}", 1_000 + k, f"i{seed}-{k}", "c", label_of[genre], (), (),
            features={"genres": (genre,)},
        ))
    return SampleColumns.from_samples(samples)


def test_a_genres_bias_learns_a_genres_rate_on_items_never_seen_again() -> None:
    """Every target a new item, one category: only the genres tell the label. Their biases
    learn it; the model then ranks a fresh batch of new items by genre.
    """
    paddle.seed(0)
    label_of = {"a": 1, "b": 0, "c": 1, "d": 0}
    learner = DINLearner(CFG, schema=SCHEMA)
    for seed in range(3):
        learner.learn_many(_batch(label_of, 400, seed))
    batch = _batch(label_of, 200, 9)
    assert auc(batch.label, learner.predict_many(batch)) > 0.9
