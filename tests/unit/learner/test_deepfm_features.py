"""DeepFM reading the declared features: a field per side of each, trained, snapshotted and exported.

The contract suite (test_contract.py) runs every check on a DeepFM declaring one feature of each
kind and role (the checks' samples carry none: each reads its default); these give the features
values. A DeepFM declaring none keeps the state layout it had before it read any: a snapshot
written then (``deepfm_before_features.safetensors``: the state of ``BEFORE_CONFIG`` trained on
``before_batch(0..2)`` by commit 83d55d9, its scores of ``before_batch(9)`` as ``test/scores``,
the user statistics' 2^20 buckets as their nonzero rows under ``test/sparse/``) loads and scores
as it did.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from streamrec.config import ModelConfig, StreamrecConfig
from streamrec.errors import ConfigError
from streamrec.features import FeatureSchema, FeatureSpec
from streamrec.learner.columns import SampleColumns
from streamrec.samples import FeatureValue, Sample
from tests.unit.learner.test_features import (
    AGE,
    DEVICE,
    GENRES,
    PRICE,
    RATING,
    SCHEMA,
    T0,
    clicks_decided_by_context,
    featured,
    model,
)

pytest.importorskip("paddle")

from streamrec.learner.deepfm import DeepFM  # noqa: E402 -- after the skip: Paddle is optional
from streamrec.learner.deepfm_learner import DeepFMLearner  # noqa: E402
from streamrec.learner.metrics import gauc  # noqa: E402

BEFORE = Path(__file__).parent / "deepfm_before_features.safetensors"

# The snapshot's model: a user table, id statistics, match features and dynamic item ids.
BEFORE_CONFIG = ModelConfig.model_validate(
    {
        "learner": "deepfm",
        "sequence_length": 4,
        "mlp_units": (4,),
        "device": "cpu",
        "train_batch_size": 16,
        "learning_rate": 0.01,
        "tables": [
            {"name": "item", "feature": "item", "rows": 32, "dim": 2},
            {"name": "category", "feature": "category", "ids": "hashed", "rows": 16, "dim": 2},
            {"name": "user", "feature": "user", "ids": "hashed", "rows": 16, "dim": 2},
        ],
    }
)


def before_batch(seed: int) -> SampleColumns:
    """Clicks on a few items; the same for a seed in any version."""
    rng = np.random.default_rng(seed)
    return SampleColumns.from_samples(
        [
            Sample(
                f"e{seed}-{i}",
                f"u{rng.integers(0, 6)}",
                T0 + i,
                f"i{rng.integers(0, 12)}",
                f"c{rng.integers(0, 4)}",
                int(rng.integers(0, 2)),
                tuple(f"i{j}" for j in rng.integers(0, 12, 3)),
                tuple(f"c{j}" for j in rng.integers(0, 4, 3)),
            )
            for i in range(48)
        ]
    )


def deepfm(schema: FeatureSchema = SCHEMA, **update: object) -> DeepFMLearner:
    return DeepFMLearner(model(learner="deepfm", **update), schema=schema)


def test_a_snapshot_from_before_deepfm_read_features_loads_and_scores_as_it_did() -> None:
    from safetensors.numpy import load_file

    arrays = load_file(BEFORE)
    want = arrays.pop("test/scores")
    for key in sorted({k.rsplit("/", 1)[0] for k in arrays if k.startswith("test/sparse/")}):
        dense = np.zeros(int(arrays.pop(f"{key}/size")[0]), np.float32)
        dense[arrays.pop(f"{key}/rows")] = arrays.pop(f"{key}/values")
        arrays[key.removeprefix("test/sparse/")] = dense
    learner = DeepFMLearner(BEFORE_CONFIG)
    assert set(learner.state_arrays()) == set(arrays)  # no key added or lost without features
    learner.load_state_arrays(arrays)
    np.testing.assert_allclose(learner.predict_many(before_batch(9)), want, rtol=1e-5, atol=1e-7)


def test_each_declared_feature_is_a_field_of_the_model_dim() -> None:
    learner = deepfm()
    # the features' own tables take the model's one dim (4), not DIN's default (8)
    declared = {k: v for k, v in learner.plan.tables.items() if k not in ("item", "category")}
    assert declared == {"genres": (2**16, 4), "device": (2**16, 4), "age": (5, 4)}
    model_ = learner.model
    assert isinstance(model_, DeepFM)
    # genres (target, history), device, age: 4 more fields beside item and category's 4
    fields = 4 + 4
    numbers = ["price__target", "rating__history", "price__history"]
    assert sorted(model_.number_names) == sorted(numbers)
    first = model_.dnn.mlp[0]
    assert first.weight.shape[0] == fields * 4 + model_.dense_dim + 4 + len(numbers)  # 4: match


def test_a_feature_table_of_another_dim_is_refused_in_one_line() -> None:
    tables = [
        *model().model_dump()["tables"],
        {"name": "genres", "feature": "genres", "ids": "hashed", "rows": 64, "dim": 8},
    ]
    with pytest.raises(ConfigError, match="one embedding dim") as caught:
        deepfm(FeatureSchema.of([GENRES]), tables=tables)
    assert "\n" not in str(caught.value)


def test_deepfm_with_every_kind_trains_scores_and_round_trips(tmp_path: Path) -> None:
    from streamrec.learner.snapshotting import group_state
    from streamrec.snapshots.store import SnapshotStore

    learner = deepfm()
    batch = SampleColumns.from_samples(featured(8))
    for _ in range(5):
        learner.learn_many(batch)
    state = learner.state_arrays()
    assert state["model/features/rating/moments"][0] == 5 * 8
    store = SnapshotStore(tmp_path)
    store.write(group_state(state), micro_batches=1, samples_trained=8, positions=())
    _, tensors = store.latest_valid()  # type: ignore[misc]
    restored = deepfm()
    restored.load_state_arrays({f"{g}/{k}": v for g, a in tensors.items() for k, v in a.items()})
    fresh = SampleColumns.from_samples(featured(8))
    np.testing.assert_allclose(restored.predict_many(fresh), learner.predict_many(fresh), rtol=1e-6)


@pytest.mark.parametrize("feature", [GENRES, RATING, DEVICE, AGE, PRICE], ids=lambda f: f.name)
def test_every_feature_moves_the_score_and_reads_its_default_when_missing(feature: FeatureSpec) -> None:
    learner = deepfm(FeatureSchema.of([feature]))
    samples = featured(64)
    for _ in range(3):
        learner.learn_many(SampleColumns.from_samples(samples))
    two = samples[:2]
    values: dict[str, FeatureValue] = {"genres": ("zz",), "device": "web", "age": 12.0, "price": 900.0}
    seq: dict[str, tuple[FeatureValue | None, ...]] = {"genres": (("zz",), ("yy",)), "rating": (-3.0, 2.0)}
    changed = [
        Sample(
            s.sample_id,
            s.user_id,
            s.ts,
            s.item_id,
            s.category_id,
            s.label,
            s.seq_items,
            s.seq_categories,
            features={**s.features, **{k: v for k, v in values.items() if k == feature.name}},
            seq_features={**s.seq_features, **{k: v for k, v in seq.items() if k == feature.name}},
        )
        for s in two
    ]
    bare = [
        Sample(s.sample_id, s.user_id, s.ts, s.item_id, s.category_id, s.label, s.seq_items, s.seq_categories)
        for s in two
    ]
    scores = learner.predict_many(SampleColumns.from_samples(two))
    moved = learner.predict_many(SampleColumns.from_samples(changed))
    assert not np.allclose(scores, moved)
    absent = learner.predict_many(SampleColumns.from_samples(bare))  # missing: its default, not an error
    assert np.isfinite(absent).all() and not np.allclose(moved, absent)


def test_a_context_feature_that_decides_the_click_is_learnt() -> None:
    schema = FeatureSchema.of([FeatureSpec(name="slot", role="context")])
    train = [SampleColumns.from_samples(clicks_decided_by_context(512, seed)) for seed in range(6)]
    test = SampleColumns.from_samples(clicks_decided_by_context(512, 99))

    def score(s: FeatureSchema) -> float:
        learner = deepfm(s, id_stats=False)
        for batch in train:
            learner.learn_many(batch)
        return gauc(test.label, learner.predict_many(test), test.user_ids)

    with_slot, without = score(schema), score(FeatureSchema.default())
    assert with_slot > 0.9 and without < 0.65, (with_slot, without)


@pytest.fixture
def no_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamrec.learner import runner as runner_module
    from tests.unit.learner.test_runner_snapshots import FakeConsumer

    monkeypatch.setattr(runner_module, "make_consumer", lambda *_, **__: FakeConsumer())


def settings(snapshot_dir: Path, features: list[FeatureSpec]) -> StreamrecConfig:
    return StreamrecConfig.model_validate({
        "learner": {"snapshot_dir": snapshot_dir}, "model": model(learner="deepfm").model_dump(),
        "features": features,
    })


@pytest.mark.parametrize("added", [[RATING, DEVICE, PRICE], [AGE]], ids=["numbers-and-an-id", "a-bucket"])
def test_a_snapshot_resumes_under_added_features_scoring_as_before(
    tmp_path: Path, no_broker: None, added: list[FeatureSpec]
) -> None:
    from streamrec.learner.registry import make_learner
    from streamrec.learner.runner import LearnerRunner

    before = settings(tmp_path, [GENRES])
    old = make_learner(before.model, before.feature_schema())
    batch = SampleColumns.from_samples(featured(16))
    old.learn_many(batch)
    with LearnerRunner(before, old) as runner:
        runner.stats.micro_batches = 1
        runner.snapshot()
    cfg = settings(tmp_path, [GENRES, *added])
    learner = make_learner(cfg.model, cfg.feature_schema())
    with LearnerRunner(cfg, learner):
        pass
    # the new fields start at zero, their deep inputs with zero weights: the same scores
    fresh = SampleColumns.from_samples(featured(16))  # not the trained batch, whose encoding is cached
    np.testing.assert_allclose(learner.predict_many(fresh), old.predict_many(fresh), rtol=1e-5)
    for _ in range(3):
        learner.learn_many(batch)  # and it learns them
    assert not np.allclose(learner.predict_many(fresh), old.predict_many(fresh), rtol=1e-3)


def test_an_untrained_deepfm_is_not_swung_by_a_large_number() -> None:
    """A standardized number reads raw before its moments (a year, ~2000): FM's x * v starts at 0."""
    year = FeatureSpec(name="year", kind="number", transform="standardize")
    learner = deepfm(FeatureSchema.of([year]))
    samples = featured(4)
    dated = [
        Sample(s.sample_id, s.user_id, s.ts, s.item_id, s.category_id, s.label, s.seq_items, s.seq_categories,
               features={"year": 1995.0}, seq_features={"year": (1980.0, 2010.0)})
        for s in samples
    ]
    scores = learner.predict_many(SampleColumns.from_samples(dated))
    np.testing.assert_allclose(scores, learner.predict_many(SampleColumns.from_samples(samples)), rtol=1e-6)
    assert ((scores > 0.3) & (scores < 0.7)).all(), scores
