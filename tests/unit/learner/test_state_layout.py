"""A snapshot's state layout: recorded in its manifest, migrated on load.

``state_layout1_<learner>.safetensors`` hold the state of a tiny DIN and DeepFM (every kind
of table: a dynamic item table, a hashed category table, a user table, a declared ``ids``
feature with its own small table, a standardized number and an outcome) trained on the
first micro-batches of the bundled MovieLens samples by the code before the built-in and the
declared tables were embedded by one path (commit 66aaed8, state layout 1), and its scores
of the last micro-batch as ``test/scores``; the user statistics' 2^20 buckets are stored as
their nonzero rows under ``test/sparse/``. Written by `write_fixture`, run on that commit::

    git worktree add /tmp/tables-base 66aaed8
    PYTHONPATH=/tmp/tables-base python -c "import runpy; runpy.run_path(
        'tests/unit/learner/test_state_layout.py', run_name='fixture')"
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamrec.config import ModelConfig, StreamrecConfig
from streamrec.datasets.sources import load_events
from streamrec.errors import SnapshotError
from streamrec.features import FeatureSchema, FeatureSpec
from streamrec.learner.columns import SampleColumns
from streamrec.replay.batches import build_samples, by_count

pytest.importorskip("paddle")

HERE = Path(__file__).parent
MOVIELENS_DIR = HERE.parents[2] / "streamrec" / "demo_data" / "movielens-latest-small"
SCHEMA = FeatureSchema.of((
    FeatureSpec(name="genres", kind="ids", max_ids=10),
    FeatureSpec(name="year", kind="number", transform="standardize"),
    FeatureSpec(name="rating", kind="number", outcome=True),
))
CONFIG = {
    "tables": [
        {"name": "item", "feature": "item", "rows": 256, "dim": 2, "initial_rows": 32},
        {"name": "category", "feature": "category", "ids": "hashed", "rows": 16, "dim": 2},
        {"name": "users", "feature": "user", "ids": "hashed", "rows": 16, "dim": 2},
        {"name": "genre", "feature": "genres", "ids": "hashed", "rows": 16, "dim": 2},
    ],
    "sequence_length": 4, "attention_units": (4,), "mlp_units": (4,), "device": "cpu",
    "train_batch_size": 32, "learning_rate": 0.01, "seed": 5,
}
LEARNERS = ("din", "deepfm")


def _batches() -> list[SampleColumns]:
    events = load_events(MOVIELENS_DIR, limit=400, schema=SCHEMA)
    samples = build_samples(events, StreamrecConfig(features=SCHEMA.extras), SCHEMA)
    return [SampleColumns.from_samples(b.samples) for b in by_count(samples, 100)]


def _learner(name: str):  # noqa: ANN202 -- a Learner of either version of the code
    from streamrec.learner.registry import make_learner

    return make_learner(ModelConfig.model_validate({**CONFIG, "learner": name}), schema=SCHEMA)


def _settings(name: str) -> StreamrecConfig:
    model = ModelConfig.model_validate({**CONFIG, "learner": name})
    return StreamrecConfig(model=model, features=SCHEMA.extras)


def write_fixture(folder: Path) -> None:
    """Train each learner on all but the last micro-batch; save its state and its scores of that one."""
    from safetensors.numpy import save_file

    batches = _batches()
    for name in LEARNERS:
        learner = _learner(name)
        for batch in batches[:-1]:
            learner.learn_many(batch)
        arrays = dict(learner.state_arrays())
        arrays["test/scores"] = np.asarray(learner.predict_many(batches[-1]), np.float64)
        for key in [k for k, a in arrays.items() if a.ndim == 1 and a.size >= 2**16]:
            dense = arrays.pop(key)
            rows = np.flatnonzero(dense)
            arrays[f"test/sparse/{key}/rows"] = rows.astype(np.int64)
            arrays[f"test/sparse/{key}/values"] = dense[rows]
            arrays[f"test/sparse/{key}/size"] = np.array([dense.size], np.int64)
        contiguous = {k: np.ascontiguousarray(a) for k, a in arrays.items()}
        save_file(contiguous, str(folder / f"state_layout1_{name}.safetensors"))


def _fixture(name: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
    from safetensors.numpy import load_file

    arrays = load_file(HERE / f"state_layout1_{name}.safetensors")
    want = arrays.pop("test/scores")
    for key in sorted({k.rsplit("/", 1)[0] for k in arrays if k.startswith("test/sparse/")}):
        dense = np.zeros(int(arrays.pop(f"{key}/size")[0]), np.float32)
        dense[arrays.pop(f"{key}/rows")] = arrays.pop(f"{key}/values")
        arrays[key.removeprefix("test/sparse/")] = dense
    return arrays, want


def assert_scores_as_they_were(got: np.ndarray, want: np.ndarray) -> None:
    """The fixture's scores, to 1e-6: bit for bit on the machine that wrote them (66aaed8 and
    this code alike there), but another processor's BLAS kernels may differ in the last bits.
    """
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", LEARNERS)
def test_a_layout_1_state_migrates_and_scores_as_it_did(name: str) -> None:
    """Layout 3 gave DIN's wide part the declared genres: the fixture has no bias for them, and
    the migrated model's start at zero, so it scores as it did (DeepFM's had them all along).
    """
    from streamrec.learner.snapshotting import group_state, state_of
    from streamrec.snapshots.manifest import SnapshotManifest

    arrays, want = _fixture(name)
    learner = _learner(name)
    genre = "model/model.wide.biases.genre.weight"
    assert (genre in arrays) == (name == "deepfm")
    written = SnapshotManifest(1, "2026-12-03T00:00:00Z", 0, 0, (), config={"features": SCHEMA.to_json()})
    assert written.state_layout == 1
    learner.load_state_arrays(state_of(learner, written, group_state(arrays), added=False))
    assert not learner.state_arrays()[genre].any() or name == "deepfm"
    got = np.asarray(learner.predict_many(_batches()[-1]), np.float64)
    assert_scores_as_they_were(got, want)


def _layout_1_store(root: Path, name: str, layout: int | None = None) -> tuple[Any, np.ndarray]:
    """A snapshot store holding the fixture as a version written before layouts (or of ``layout``)."""
    from streamrec.learner.snapshotting import group_state
    from streamrec.snapshots.store import SnapshotStore

    arrays, want = _fixture(name)
    model = ModelConfig.model_validate({**CONFIG, "learner": name}).model_dump(mode="json")
    config: dict[str, Any] = {"model": model, "features": SCHEMA.to_json()}
    if layout is not None:
        config["state_layout"] = layout
    store = SnapshotStore(root)
    store.write(group_state(arrays), micro_batches=3, samples_trained=300, positions=(), config=config)
    return store, want


@pytest.mark.parametrize("layout", [None, 2])
@pytest.mark.parametrize("name", LEARNERS)
def test_a_layout_1_snapshot_restores_and_exports_scoring_as_it_did(
    name: str, layout: int | None, tmp_path: Path
) -> None:
    """Recorded as layout 1 (no layout in the manifest) or 2 (the same arrays): both lack the
    declared features' wide biases of layout 3's DIN.
    """
    from streamrec.learner.snapshotting import restore
    from streamrec.serving.export import learner_from_snapshot

    store, want = _layout_1_store(tmp_path, name, layout)
    learner = _learner(name)
    cfg = _settings(name)
    manifest = restore(cfg, SCHEMA, learner, store)
    assert manifest is not None and manifest.state_layout == (layout or 1)
    batch = _batches()[-1]
    assert_scores_as_they_were(np.asarray(learner.predict_many(batch), np.float64), want)
    _, exported = learner_from_snapshot(store, manifest.version)  # the export's path
    assert_scores_as_they_were(np.asarray(exported.predict_many(batch), np.float64), want)


def _sorted_id_maps(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The id maps as layout 3 held them: sorted by key, no holes."""
    out = dict(arrays)
    for prefix in {k.rsplit("/", 1)[0] for k in arrays if k.startswith("model/ids/")}:
        live = arrays[f"{prefix}/rows"] != -2
        order = np.argsort(arrays[f"{prefix}/keys"][live])
        for field in ("keys", "rows", "counts", "last_seen"):
            out[f"{prefix}/{field}"] = arrays[f"{prefix}/{field}"][live][order]
    return out


@pytest.mark.parametrize("name", LEARNERS)
def test_a_layout_3_snapshot_restores_and_trains_on_as_the_learner_that_wrote_it(
    name: str, tmp_path: Path
) -> None:
    """Layout 4 keeps the id maps by slot; layout 3's, sorted by key, load as they are."""
    from streamrec.learner.snapshotting import group_state, restore
    from streamrec.snapshots.store import SnapshotStore

    batches = _batches()
    original = _learner(name)
    for batch in batches[:2]:
        original.learn_many(batch)
    model = ModelConfig.model_validate({**CONFIG, "learner": name}).model_dump(mode="json")
    config = {"model": model, "features": SCHEMA.to_json(), "state_layout": 3}
    store = SnapshotStore(tmp_path)
    arrays = _sorted_id_maps(dict(original.state_arrays()))
    store.write(group_state(arrays), micro_batches=2, samples_trained=200, positions=(), config=config)
    restored = _learner(name)
    manifest = restore(_settings(name), SCHEMA, restored, store)
    assert manifest is not None and manifest.state_layout == 3
    for batch in batches[2:]:
        original.learn_many(batch)
        restored.learn_many(batch)
    probe = batches[-1]
    np.testing.assert_array_equal(restored.predict_many(probe), original.predict_many(probe))
    after, before = restored.state_arrays(), original.state_arrays()
    assert _sorted_id_maps(dict(after)).keys() == after.keys()
    for key, value in _sorted_id_maps(dict(after)).items():
        np.testing.assert_array_equal(value, _sorted_id_maps(dict(before))[key], err_msg=key)


def test_a_snapshot_of_a_newer_layout_is_refused_in_one_line(tmp_path: Path) -> None:
    from streamrec.learner.snapshotting import restore
    from streamrec.learner.state import STATE_LAYOUT

    store, _ = _layout_1_store(tmp_path, "din", layout=STATE_LAYOUT + 1)
    refused = rf"snapshot v000001 in .*: state layout {STATE_LAYOUT + 1} is not one this version reads"
    with pytest.raises(SnapshotError, match=refused):
        restore(_settings("din"), SCHEMA, _learner("din"), store)


def test_the_layout_is_recorded_in_a_snapshot_and_reads_1_before_it_was() -> None:
    from streamrec.learner.snapshotting import snapshot_config
    from streamrec.learner.state import STATE_LAYOUT
    from streamrec.snapshots.manifest import SnapshotManifest

    config = snapshot_config(StreamrecConfig(), FeatureSchema.default())
    assert config["state_layout"] == STATE_LAYOUT
    manifest = SnapshotManifest(1, "2026-12-03T00:00:00Z", 0, 0, (), config=config)
    assert manifest.state_layout == STATE_LAYOUT
    before = SnapshotManifest(1, "2026-12-03T00:00:00Z", 0, 0, (), config={"model": {}})
    assert before.state_layout == 1


def test_a_layout_newer_than_the_code_is_refused_in_one_line() -> None:
    from streamrec.learner.state import STATE_LAYOUT, migrate_state

    with pytest.raises(SnapshotError, match="state layout"):
        migrate_state({}, STATE_LAYOUT + 1)


if __name__ == "fixture":
    write_fixture(HERE)
