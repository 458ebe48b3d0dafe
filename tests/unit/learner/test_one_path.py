"""Built-in and declared tables take one path: planned alike, built by one loop, looked up by one function."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from streamrec.config import ModelConfig
from streamrec.features import FeatureSchema, FeatureSpec
from streamrec.learner.columns import SampleColumns
from streamrec.samples import Sample

paddle = pytest.importorskip("paddle")

from streamrec.learner.deepfm_learner import DeepFMLearner  # noqa: E402 -- after the skip: Paddle is optional
from streamrec.learner.din import DINLearner  # noqa: E402
from streamrec.learner.embedding import EmbeddingArch  # noqa: E402

T0 = 1_700_000_000_000
SCHEMA = FeatureSchema.of([
    FeatureSpec(name="shop"),
    FeatureSpec(name="genres", kind="ids", max_ids=3),
    FeatureSpec(name="device", role="context"),
])
# A user table first: the tables are built in STREAMREC_MODEL__TABLES order, the built-ins' first.
TABLES = [
    {"name": "users", "feature": "user", "ids": "hashed", "rows": 16, "dim": 4},
    {"name": "item", "feature": "item", "rows": 64, "dim": 4, "initial_rows": 16},
    {"name": "category", "feature": "category", "ids": "hashed", "rows": 16, "dim": 4},
    {"name": "shared", "feature": "shop", "also": ["device"], "ids": "hashed", "rows": 16, "dim": 4},
]
LEARNERS = {"din": DINLearner, "deepfm": DeepFMLearner}


def _learner(name: str) -> Any:
    cfg = ModelConfig.model_validate({
        "learner": name, "tables": TABLES, "sequence_length": 4, "attention_units": (4,),
        "mlp_units": (4,), "device": "cpu", "train_batch_size": 8,
    })
    return LEARNERS[name](cfg, schema=SCHEMA)


def _batch() -> SampleColumns:
    return SampleColumns.from_samples([
        Sample(f"e{i}", f"u{i % 3}", T0 + i, f"i{i}", f"c{i % 2}", i % 2, ("i1", "i2"), ("c0", "c1"),
               features={"shop": f"s{i % 2}", "genres": ("a", "b"), "device": "ios"},
               seq_features={"shop": ("s1", "s0"), "genres": (("a",), None)})
        for i in range(6)
    ])


@pytest.mark.parametrize("name", list(LEARNERS))
def test_every_table_is_planned_and_built_alike_in_one_order(name: str) -> None:
    learner = _learner(name)
    plan = learner.plan
    assert list(plan.tables) == ["users", "item", "category", "shared", "genres"]
    assert list(learner.model.embedding.tables) == list(plan.tables)
    assert plan.table_of("shop") == plan.table_of("device") == "shared"  # two features, one table
    kinds = {f.name: (f.spec.kind, f.spec.role, f.table, f.width, f.builtin) for f in plan.features}
    assert kinds == {
        "user": ("id", "user", "users", 4, True),
        "item": ("id", "behaviour", "item", 4, True),
        "category": ("id", "behaviour", "category", 4, True),
        "shop": ("id", "behaviour", "shared", 4, False),
        "genres": ("ids", "behaviour", "genres", 4 if name == "deepfm" else 8, False),
        "device": ("id", "context", "shared", 4, False),
    }


@pytest.mark.parametrize("name", list(LEARNERS))
def test_every_feature_is_looked_up_by_one_function_in_plan_order(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    learner = _learner(name)
    seen: list[str] = []
    lookup = EmbeddingArch.lookup

    def recording(self: EmbeddingArch, feature: Any, x: Any) -> Any:
        seen.append(feature.name)
        return lookup(self, feature, x)

    monkeypatch.setattr(EmbeddingArch, "lookup", recording)
    scores = learner.predict_many(_batch())
    assert np.isfinite(scores).all()
    inputs = [f.name for f, _ in learner.plan.inputs]
    assert inputs == [
        "item", "category", "shop", "genres", "item", "category", "shop", "genres", "user", "device",
    ]
    assert sorted(seen) == sorted(inputs)  # each input once, built-in or declared
    if name == "din":
        assert seen == inputs  # DIN reads them in plan order


def test_the_export_graph_feeds_the_model_in_plan_order() -> None:
    from streamrec.serving.graph import input_order

    plan = _learner("din").plan
    # the contract's: targets (item, category), sequences (item, category), context (user),
    # then the declared features' inputs (shop, genres targets; their sequences; device)
    assert plan.input_keys == (
        "shop/target", "genres/target", "shop/sequence", "genres/sequence", "device/target",
    )
    assert input_order(plan) == [0, 1, 5, 6, 2, 3, 7, 8, 4, 9]
