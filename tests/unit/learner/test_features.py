"""Declared features on the learner side: keyed batch columns, their encoding, the DIN reading
them, snapshots that record the schema and resume under an added feature.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from streamrec.config import ModelConfig, StreamrecConfig
from streamrec.errors import ConfigError, SchemaChange
from streamrec.features import FeatureSchema, FeatureSpec
from streamrec.learner.columns import Jagged, SampleColumns
from streamrec.learner.din import DINLearner
from streamrec.learner.features import DEFAULT_DIM, DEFAULT_ROWS, FeaturePlan, Moments, encode_features
from streamrec.learner.metrics import gauc
from streamrec.samples import Sample

T0 = 1_700_000_000_000
GENRES = FeatureSpec(name="genres", kind="ids", max_ids=3)
RATING = FeatureSpec(name="rating", kind="number", outcome=True, transform="standardize")
DEVICE = FeatureSpec(name="device", role="context")
AGE = FeatureSpec(name="age", kind="number", role="user", transform="bucket", boundaries=(18.0, 30.0, 50.0))
PRICE = FeatureSpec(name="price", kind="number", transform="log1p")
SCHEMA = FeatureSchema.of([GENRES, RATING, DEVICE, AGE, PRICE])


def model(**update: object) -> ModelConfig:
    base = {
        "tables": [{"name": "item", "feature": "item", "rows": 256, "dim": 4},
                   {"name": "category", "feature": "category", "ids": "hashed", "rows": 64, "dim": 4}],
        "sequence_length": 4, "attention_units": (8,), "mlp_units": (8,), "device": "cpu",
        "train_batch_size": 64, "learning_rate": 0.01,
    }
    return ModelConfig.model_validate({**base, **update})


def featured(n: int = 2) -> list[Sample]:
    """``n`` samples of user u1 with every kind of feature, the history two behaviours long."""
    return [
        Sample(f"e{i}", "u1", T0, f"i{i}", "c1", i % 2, ("i8", "i9"), ("c1", "c2"),
               features={"genres": ("a", "b"), "device": "ios", "age": 33.0, "price": 3.0},
               seq_features={"genres": (("a",), None), "rating": (4.0, None)})
        for i in range(n)
    ]


# -- the keyed batch ------------------------------------------------------------------------

def test_a_batch_without_declared_features_has_the_default_schemas_only() -> None:
    batch = SampleColumns.from_samples([Sample("e1", "u1", T0, "i1", "c1", 1, ("i2",), ("c1",))])
    assert list(batch.features) == ["item", "category"]


def test_each_kind_becomes_its_column() -> None:
    samples = featured(1) + [Sample("e9", "u2", T0, "i1", "c1", 0, ("i3",), ("c3",))]
    extras = SampleColumns.from_samples(samples).features
    assert extras["device"].kind == "id" and extras["device"].target == ["ios", ""]
    assert extras["device"].sequence is None  # a context feature has no sequence side
    genres = extras["genres"]
    assert isinstance(genres.target, Jagged) and isinstance(genres.sequence, Jagged)
    assert genres.target.values == ["a", "b"] and genres.target.offsets.tolist() == [0, 2, 2]
    # along the sequences, aligned with seq_items: (a), missing, and u2's behaviour without it
    assert genres.sequence.values == ["a"] and genres.sequence.offsets.tolist() == [0, 1, 1, 1]
    rating = extras["rating"]
    assert rating.target is None  # an outcome: along the sequence only
    assert isinstance(rating.sequence, np.ndarray) and rating.sequence.dtype == np.float32
    np.testing.assert_array_equal(rating.sequence, [4.0, np.nan, np.nan])
    assert isinstance(extras["age"].target, np.ndarray)
    np.testing.assert_array_equal(extras["age"].target, [33.0, np.nan])


def test_a_sequence_feature_of_another_length_than_the_history_is_refused() -> None:
    bad = Sample("e1", "u1", T0, "i1", "c1", 1, ("i2", "i3"), ("c1", "c1"), seq_features={"rating": (1.0,)})
    with pytest.raises(ValueError, match="feature 'rating' has 1 values along 2 behaviours"):
        SampleColumns.from_samples([bad])


def test_a_feature_of_two_kinds_in_one_batch_is_refused() -> None:
    samples = [Sample("e1", "u1", T0, "i1", "c1", 1, (), (), features={"x": "a"}),
               Sample("e2", "u1", T0, "i1", "c1", 1, (), (), features={"x": 1.0})]
    with pytest.raises(ValueError, match="feature 'x' holds values of kinds"):
        SampleColumns.from_samples(samples)


# -- the plan and the encoding ----------------------------------------------------------------

def test_the_plan_gives_declared_features_their_tables() -> None:
    cfg = model(tables=[*model().model_dump()["tables"],
                        {"name": "tags", "feature": "genres", "ids": "hashed", "rows": 32, "dim": 3}])
    plan = FeaturePlan(cfg, SCHEMA)
    assert plan.tables == {  # every table, the built-in features' first
        "item": (256, 4), "category": (64, 4),
        "tags": (32, 3), "device": (DEFAULT_ROWS, DEFAULT_DIM), "age": (5, DEFAULT_DIM),
    }
    # the targets' features first, the built-ins before the declared
    assert [f.name for f in plan.sequence] == ["item", "category", "genres", "price", "rating"]
    assert [f.name for f in plan.head] == ["device", "age"]
    assert [f.name for f in plan.declared] == ["genres", "price", "rating", "device", "age"]
    assert (plan.query_width, plan.outcome_width, plan.head_width) == (4 + 4 + 4, 1, 16)
    assert plan.keys == (
        "item/target", "category/target", "genres/target", "price/target",
        "item/sequence", "category/sequence", "genres/sequence", "price/sequence", "rating/sequence",
        "device/target", "age/target",
    )
    assert plan.input_keys == tuple(k for k in plan.keys if not k.startswith(("item/", "category/")))


def test_the_plan_is_immutable_and_derives_its_inputs_once() -> None:
    plan = FeaturePlan(model(), SCHEMA)
    assert plan.keys is plan.keys and plan.inputs is plan.inputs and plan.declared is plan.declared
    assert isinstance(plan.keys, tuple) and isinstance(plan.features, tuple)
    with pytest.raises(AttributeError, match="FeaturePlan is immutable"):
        plan.features = ()
    with pytest.raises(AttributeError, match="FeaturePlan is immutable"):
        del plan.schema
    with pytest.raises(TypeError):
        plan.tables["more"] = (8, 2)  # type: ignore[index]  # the refusal is what is tested
    assert "more" not in plan.tables and plan.keys == FeaturePlan(model(), SCHEMA).keys


def test_the_user_id_is_a_planned_feature_of_its_table() -> None:
    cfg = model(tables=[*model().model_dump()["tables"],
                        {"name": "users", "feature": "user", "ids": "hashed", "rows": 32, "dim": 3}])
    plan = FeaturePlan(cfg, SCHEMA)
    user = plan.head[0]
    assert (user.name, user.table, user.width, user.builtin) == ("user", "users", 3, True)
    assert user.spec.role == "user"
    assert [f.name for f in plan.head] == ["user", "device", "age"]
    assert plan.n_context == 1 and "user" not in SCHEMA.names  # never a schema's feature


def test_two_features_may_share_a_table() -> None:
    schema = FeatureSchema.of([GENRES, FeatureSpec(name="main_genre")])
    cfg = model(tables=[*model().model_dump()["tables"],
                        {"name": "genre", "feature": "genres", "also": ["main_genre"], "ids": "hashed",
                         "rows": 32, "dim": 3}])
    plan = FeaturePlan(cfg, schema)
    assert list(plan.tables) == ["item", "category", "genre"] and plan.tables["genre"] == (32, 3)
    assert plan.table_of("genres") == plan.table_of("main_genre") == "genre"


@pytest.mark.parametrize(("table", "error"), [
    ({"name": "t", "feature": "colour", "ids": "hashed", "rows": 8},
     "feature 'colour', which is not declared"),
    ({"name": "t", "feature": "price", "ids": "hashed", "rows": 8}, "number feature 'price' has no ids"),
])
def test_a_table_of_an_undeclared_feature_or_a_number_is_refused(
    table: dict[str, object], error: str
) -> None:
    cfg = model(tables=[*model().model_dump()["tables"], table])
    with pytest.raises(ConfigError, match=error):
        FeaturePlan(cfg, SCHEMA)


def test_a_declared_features_table_must_be_hashed() -> None:
    with pytest.raises(ValueError, match="must be ids='hashed'"):
        model(tables=[*model().model_dump()["tables"], {"name": "t", "feature": "genres", "rows": 8}])


def test_encoding_pads_aligns_and_transforms() -> None:
    plan = FeaturePlan(model(), SCHEMA)
    batch = SampleColumns.from_samples(featured(1))
    moments = Moments(plan.standardized)
    x = encode_features(batch, plan, 4, moments)
    assert x["rating/sequence"][0].tolist() == [0.0, 0.0, 0.0, 0.0]  # no moments yet: absent
    moments.update("rating", np.array([1.0, 3.0], np.float32))  # mean 2, variance 1
    x = encode_features(batch, plan, 4, moments)
    assert x["genres/target"].shape == (1, 3) and (x["genres/target"][0, :2] > 0).all()
    assert x["genres/target"][0, 2] == 0  # padding
    # right-aligned as the items: the history (i8, i9) sits at columns 2 and 3
    assert x["genres/sequence"].shape == (1, 4, 3)
    assert x["genres/sequence"][0, 2, 0] > 0 and (x["genres/sequence"][0, 3] == 0).all()
    # the history's rating, 4.0, at column 2, standardized; the padding stays 0
    np.testing.assert_allclose(x["rating/sequence"][0], [0.0, 0.0, 2.0, 0.0], rtol=1e-5)
    assert "rating/target" not in x
    assert x["age/target"].tolist() == [3]  # 33 in [30, 50): the third bucket, row 3
    assert x["price/target"][0] == pytest.approx(np.log1p(3.0))
    assert x["device/target"].dtype == np.int64 and x["device/target"][0] > 0


def test_standardize_uses_the_running_moments() -> None:
    moments = Moments(["r"])
    moments.update("r", np.array([1.0, 3.0, np.nan], np.float32))
    moments.update("r", np.array([5.0], np.float32))
    n, mean, m2 = moments.arrays["r"]
    assert (n, mean) == (3, 3.0) and m2 / n == pytest.approx(np.var([1, 3, 5]))
    assert moments.standardize("r", np.array([3.0], np.float32))[0] == pytest.approx(0.0)


def test_a_standardized_number_reads_as_absent_until_it_has_moments() -> None:
    """Found by a tour of docs/backtesting.md: a ``year`` that appears only after the first
    micro-batches (producers that start sending it, a feature declared late) was read raw,
    ~2000, by a model trained without it; the micro-batch it appeared in scored logloss 5.12
    against 0.69-0.71 either side.
    """
    year = FeatureSpec(name="year", kind="number", transform="standardize")
    learner = din(FeatureSchema.of([year]))
    samples = featured(16)
    for _ in range(3):
        learner.learn_many(SampleColumns.from_samples(samples))  # no year yet: no moments
    assert learner.feature_moments["year"][0] == 0
    dated = [
        Sample(s.sample_id, s.user_id, s.ts, s.item_id, s.category_id, s.label, s.seq_items, s.seq_categories,
               features={"year": 1995.0}, seq_features={"year": (1980.0, 2010.0)})
        for s in samples
    ]
    np.testing.assert_allclose(learner.predict_many(SampleColumns.from_samples(dated)),
                               learner.predict_many(SampleColumns.from_samples(samples)), rtol=1e-6)


def test_the_first_micro_batch_of_a_standardized_number_trains_on_it_standardized() -> None:
    """Its own moments, taken after it was scored and before it is trained on: trained raw, a
    year added to a running learner trained its first micro-batch at loss 735.
    """
    year = FeatureSpec(name="year", kind="number", transform="standardize")
    learner, raw, yearless = (din(FeatureSchema.of([year])) for _ in range(3))
    samples = featured(16)
    dated = SampleColumns.from_samples([
        Sample(s.sample_id, s.user_id, s.ts, s.item_id, s.category_id, s.label, s.seq_items, s.seq_categories,
               features={"year": 1995.0 + i}, seq_features={"year": (1980.0, 2010.0)})
        for i, s in enumerate(samples)
    ])
    undated = SampleColumns.from_samples(samples)
    for each in (learner, raw, yearless):
        each.learn_many(undated)  # no year yet: no moments
    learner.predict_many(dated)  # scored first: the encoding it caches is re-read for training
    loss = learner.learn_many(dated).loss
    yearless.learn_many(undated)  # as if the years had been read as absent in training too
    assert not np.allclose(learner.predict_many(undated), yearless.predict_many(undated), rtol=1e-4)
    n, mean, _ = learner.feature_moments["year"]
    assert (n, mean) == (16, pytest.approx(2002.5))  # the targets' years, counted once
    raw._moments.arrays["year"] = np.array([1.0, 0.0, 1.0])  # standardize as the identity: raw
    assert loss < 2.0 < raw.learn_many(dated).loss
    learner.learn_many(dated)
    assert learner.feature_moments["year"][0] == 32


# -- the DIN ------------------------------------------------------------------------------------

def din(schema: FeatureSchema = SCHEMA, **update: object) -> DINLearner:

    return DINLearner(model(**update), schema=schema)


def test_din_with_every_kind_trains_scores_and_round_trips(tmp_path: Path) -> None:
    from streamrec.learner.din import DINLearner
    from streamrec.learner.snapshotting import group_state
    from streamrec.snapshots.store import SnapshotStore

    learner = din()
    batch = SampleColumns.from_samples(featured(8))
    for _ in range(5):
        learner.learn_many(batch)
    state = learner.state_arrays()
    assert state["model/features/rating/moments"][0] == 5 * 8  # one rating in each history, 5 times
    store = SnapshotStore(tmp_path)
    store.write(group_state(state), micro_batches=1, samples_trained=8, positions=())
    _, tensors = store.latest_valid()  # type: ignore[misc]
    restored = DINLearner(model(), schema=SCHEMA)
    restored.load_state_arrays({f"{g}/{k}": v for g, a in tensors.items() for k, v in a.items()})
    fresh = SampleColumns.from_samples(featured(8))
    np.testing.assert_allclose(restored.predict_many(fresh), learner.predict_many(fresh), rtol=1e-6)


def test_an_outcome_is_never_in_the_target_vector() -> None:
    """Changing a behaviour's rating moves the score; the target has no rating to change."""
    learner = din(FeatureSchema.of([RATING]), mlp_units=(8,))
    samples = featured(64)
    for _ in range(3):
        learner.learn_many(SampleColumns.from_samples(samples))
    other = [Sample(s.sample_id, s.user_id, s.ts, s.item_id, s.category_id, s.label, s.seq_items,
                    s.seq_categories, seq_features={"rating": (-3.0, 2.0)}) for s in samples[:2]]
    assert not np.allclose(learner.predict_many(SampleColumns.from_samples(samples[:2])),
                           learner.predict_many(SampleColumns.from_samples(other)))


def clicks_decided_by_context(n: int, seed: int) -> list[Sample]:
    """Users clicking at random items exactly when the context feature ``slot`` is ``top``."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        top = bool(rng.random() < 0.5)
        history = tuple(f"i{j}" for j in rng.integers(0, 500, 3))
        out.append(Sample(
            f"e{seed}-{i}", f"u{rng.integers(0, 20)}", T0 + i, f"i{rng.integers(0, 500)}",
            f"c{rng.integers(0, 10)}", int(top), history, tuple("c0" for _ in history),
            features={"slot": "top" if top else f"s{rng.integers(0, 5)}"},
        ))
    return out


def test_a_context_feature_that_decides_the_click_is_learnt() -> None:
    schema = FeatureSchema.of([FeatureSpec(name="slot", role="context")])
    train = [SampleColumns.from_samples(clicks_decided_by_context(512, seed)) for seed in range(6)]
    test = SampleColumns.from_samples(clicks_decided_by_context(512, 99))

    def score(s: FeatureSchema) -> float:
        learner = din(s, id_stats=False, wide=False)
        for batch in train:
            learner.learn_many(batch)
        return gauc(test.label, learner.predict_many(test), test.user_ids)

    with_slot, without = score(schema), score(FeatureSchema.default())
    assert with_slot > 0.9 and without < 0.65, (with_slot, without)


# -- snapshots and evolution -----------------------------------------------------------------------


def config(snapshot_dir: Path, features: list[FeatureSpec]) -> StreamrecConfig:
    return StreamrecConfig.model_validate({
        "learner": {"snapshot_dir": snapshot_dir}, "model": model().model_dump(), "features": features,
    })


@pytest.fixture
def no_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamrec.learner import runner as runner_module
    from tests.unit.learner.test_runner_snapshots import FakeConsumer

    monkeypatch.setattr(runner_module, "make_consumer", lambda *_, **__: FakeConsumer())


def snapshot_under(root: Path, features: list[FeatureSpec]) -> tuple[object, SampleColumns]:
    """A DIN trained under ``features``, snapshotted in ``root`` by its runner."""
    from streamrec.learner.registry import make_learner
    from streamrec.learner.runner import LearnerRunner

    cfg = config(root, features)
    learner = make_learner(cfg.model, cfg.feature_schema())
    batch = SampleColumns.from_samples(featured(16))
    learner.learn_many(batch)
    with LearnerRunner(cfg, learner) as runner:
        runner.stats.micro_batches = 1
        manifest = runner.snapshot()
    assert manifest.schema == cfg.feature_schema()
    return learner, batch


@pytest.mark.parametrize(("before", "after"), [
    ([GENRES], [GENRES, RATING, DEVICE]),
    ([], [GENRES]),  # a behaviour feature of ids: DIN's wide part gains its biases (at zero)
])
def test_a_snapshot_resumes_under_an_added_feature_scoring_as_before(
    tmp_path: Path, no_broker: None, before: list[FeatureSpec], after: list[FeatureSpec]
) -> None:
    from streamrec.learner.registry import make_learner
    from streamrec.learner.runner import LearnerRunner

    old, batch = snapshot_under(tmp_path, before)
    cfg = config(tmp_path, after)
    learner = make_learner(cfg.model, cfg.feature_schema())
    with LearnerRunner(cfg, learner):
        pass
    # the new features' inputs enter with zero weights: the same scores until it learns them
    fresh = SampleColumns.from_samples(featured(16))  # not the trained batch, whose encoding is cached
    np.testing.assert_allclose(learner.predict_many(fresh), old.predict_many(fresh), rtol=1e-5)  # type: ignore[attr-defined]
    learner.learn_many(batch)  # and it trains


@pytest.mark.parametrize(("features", "error"), [
    ([], "feature 'genres', which is no longer declared"),
    ([FeatureSpec(name="genres", kind="id", max_ids=3)],
     "feature 'genres' declared otherwise \\(kind changed\\)"),
])
def test_a_removed_or_redeclared_feature_refuses_the_snapshot(
    tmp_path: Path, no_broker: None, features: list[FeatureSpec], error: str
) -> None:
    from streamrec.learner.registry import make_learner
    from streamrec.learner.runner import LearnerRunner

    snapshot_under(tmp_path, [GENRES])
    cfg = config(tmp_path, features)
    with pytest.raises(SchemaChange, match=error) as caught:
        LearnerRunner(cfg, make_learner(cfg.model, cfg.feature_schema()))
    assert "\n" not in str(caught.value)


def test_a_snapshot_from_before_schemas_reads_as_the_default_schema(tmp_path: Path) -> None:
    from streamrec.snapshots.store import SnapshotStore

    store = SnapshotStore(tmp_path)
    manifest = store.write({"model": {"w": np.ones(2, np.float32)}}, micro_batches=1, samples_trained=1,
                           positions=(), config={"model": {}})
    assert manifest.schema == FeatureSchema.default()


def test_learner_run_refuses_a_redeclared_feature_in_one_line(
    tmp_path: Path, no_broker: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import orjson
    from typer.testing import CliRunner

    from streamrec.cli import app

    snapshot_under(tmp_path, [GENRES])
    monkeypatch.setattr("streamrec.kafka.topics.ensure_topics", lambda *_: None)
    monkeypatch.setenv("STREAMREC_MODEL__TABLES", orjson.dumps(model().model_dump()["tables"]).decode())
    monkeypatch.setenv("STREAMREC_FEATURES", orjson.dumps([{"name": "genres", "kind": "id"}]).decode())
    result = CliRunner().invoke(app, ["learner", "run", "--snapshot-dir", str(tmp_path), "--device", "cpu"])
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.strip().splitlines() if " level=" not in line]  # logs aside
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: snapshot v000001"), lines
    assert "feature 'genres' declared otherwise" in lines[0], lines


# -- the export ---------------------------------------------------------------------------------


@pytest.mark.parametrize("user_table", [False, True], ids=["no-user-table", "user-table"])
@pytest.mark.parametrize("learner_type", ["din", "deepfm"])
def test_the_export_scores_declared_features_as_the_learner(
    tmp_path: Path, learner_type: str, user_table: bool
) -> None:
    import orjson

    from streamrec.learner.registry import make_learner
    from streamrec.learner.snapshotting import group_state
    from streamrec.serving.export import export_snapshot
    from streamrec.serving.scorer import ExportedModel
    from streamrec.snapshots.store import SnapshotStore

    tables = list(model().model_dump()["tables"])
    if user_table:
        tables.append({"name": "user", "feature": "user", "rows": 64, "dim": 4})
    cfg = model(learner=learner_type, tables=tables)
    learner = make_learner(cfg, SCHEMA)
    samples = featured(32)
    for _ in range(3):
        learner.learn_many(SampleColumns.from_samples(samples))
    store = SnapshotStore(tmp_path)
    manifest = store.write(
        group_state(learner.state_arrays()), micro_batches=1, samples_trained=0, positions=(),
        config={"model": cfg.model_dump(mode="json"), "features": SCHEMA.to_json()},
    )
    export = export_snapshot(store, manifest.version)
    contract = orjson.loads((export / "contract.json").read_bytes())
    assert contract["model"]["learner"] == learner_type
    assert contract["feature_fingerprint"] == SCHEMA.fingerprint
    assert [f["name"] for f in contract["features"]] == [
        "item", "category", "user", "genres", "price", "rating", "device", "age"  # the built-ins first
    ]
    rating = next(f for f in contract["features"] if f["name"] == "rating")
    assert rating["outcome"] and rating["inputs"] == ["rating__sequence"] and rating["moments"][0] == 3 * 32
    batch = SampleColumns.from_samples([*featured(4), Sample("e9", "u2", T0, "i1", "c1", 0, (), ())])
    scores = ExportedModel(export).score_batch(batch)
    np.testing.assert_allclose(scores, learner.predict_many(batch), rtol=1e-4, atol=1e-6)


def test_a_request_scores_an_export_with_declared_features_reading_its_context(tmp_path: Path) -> None:
    """Serving has no declared feature but the request's context: the rest read absent."""
    from streamrec.learner.snapshotting import group_state
    from streamrec.serving.export import export_snapshot
    from streamrec.serving.scorer import Candidate, ExportedModel
    from streamrec.snapshots.store import SnapshotStore

    learner = din(FeatureSchema.of([GENRES, DEVICE]))
    store = SnapshotStore(tmp_path)
    manifest = store.write(
        group_state(learner.state_arrays()), micro_batches=1, samples_trained=0, positions=(),
        config={"model": learner.cfg.model_dump(mode="json"), "features": learner.schema.to_json()},
    )
    exported = ExportedModel(export_snapshot(store, manifest.version))
    candidates = [Candidate("i1", "c1"), Candidate("i2")]
    history = [("i8", "c1"), ("i9", "c2")]
    batch = SampleColumns.from_samples([
        Sample("r", "u1", T0, "i1", "c1", 0, ("i8", "i9"), ("c1", "c2"), features={"device": "ios"}),
    ])
    scores = exported.score("u1", history, candidates, context={"device": "ios"})
    assert scores.shape == (2,)
    assert scores[0] == pytest.approx(learner.predict_many(batch)[0], rel=1e-4)
    assert exported.score("u1", history, candidates).shape == (2,)  # no context: absent


def test_serve_reads_the_context_features_from_the_request(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from streamrec.config import ServingConfig
    from streamrec.learner.snapshotting import group_state
    from streamrec.serving.http import build_app, no_history
    from streamrec.serving.scorer import Candidate, Scorer
    from streamrec.snapshots.store import SnapshotStore

    learner = din(FeatureSchema.of([DEVICE]))
    learner.learn_many(SampleColumns.from_samples([
        Sample(f"e{i}", "u1", T0, f"i{i}", "c1", i % 2, (), (),
               features={"device": "ios" if i % 2 else "web"})
        for i in range(64)
    ]))
    store = SnapshotStore(tmp_path)
    manifest = store.write(
        group_state(learner.state_arrays()), micro_batches=1, samples_trained=0, positions=(),
        config={"model": learner.cfg.model_dump(mode="json"), "features": learner.schema.to_json()},
    )
    store.promote(manifest.version)
    scorer = Scorer(tmp_path)
    with TestClient(build_app(scorer, no_history, ServingConfig())) as client:
        body = {"user": "u1", "items": ["i1:c1"], "history": [], "context": {"device": "ios"}}
        response = client.post("/score", json=body)
        assert response.status_code == 200, response.text
        want = scorer.model.score("u1", [], [Candidate("i1", "c1")], {"device": "ios"})
        assert response.json()["scores"] == pytest.approx(want.tolist(), rel=1e-6)
        other = client.post("/score", json={**body, "context": {"device": "web"}}).json()["scores"]
        assert other != pytest.approx(want.tolist(), rel=1e-6)  # the context moves the score
        bad = client.post("/score", json={**body, "context": {"device": ["a"]}})
        assert bad.status_code == 400 and "feature 'device'" in bad.text


def test_score_reads_the_context_features_from_its_flag(tmp_path: Path) -> None:
    import orjson
    from typer.testing import CliRunner

    from streamrec.cli import app
    from streamrec.learner.snapshotting import group_state
    from streamrec.serving.export import export_snapshot
    from streamrec.serving.scorer import Candidate, ExportedModel
    from streamrec.snapshots.store import SnapshotStore

    learner = din(FeatureSchema.of([DEVICE]))
    store = SnapshotStore(tmp_path)
    manifest = store.write(
        group_state(learner.state_arrays()), micro_batches=1, samples_trained=0, positions=(),
        config={"model": learner.cfg.model_dump(mode="json"), "features": learner.schema.to_json()},
    )
    store.promote(manifest.version)
    args = ["score", "--user", "u1", "--items", "i1:c1", "--no-store", "--snapshot-dir", str(tmp_path),
            "--json"]
    result = CliRunner().invoke(app, [*args, "--context", '{"device": "ios"}'])
    assert result.exit_code == 0, result.output
    exported = ExportedModel(export_snapshot(store, 1))
    want = exported.score("u1", [], [Candidate("i1", "c1")], {"device": "ios"})
    assert orjson.loads(result.stdout)["scores"] == [pytest.approx(float(want[0]), rel=1e-6)]
    bad = CliRunner().invoke(app, [*args, "--context", '{"device": 1.5}'])
    assert bad.exit_code == 1 and "feature 'device'" in bad.output
