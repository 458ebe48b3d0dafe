"""Tests for ``streamrec.learner.model`` and ``streamrec.learner.din``.

Small tables (1024 item buckets) and tiny MLPs keep the whole file fast on two CPU cores.
"""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import paddle
import pytest
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from streamrec.config import ModelConfig
from streamrec.errors import ConfigError, SnapshotError
from streamrec.learner import din as din_module
from streamrec.learner.columns import EncodedColumns, SampleColumns, encode
from streamrec.learner.din import OPTIMIZER_PREFIX, DINLearner, resolve_device
from streamrec.learner.features import model_columns
from streamrec.learner.model import DIN
from streamrec.learner.snapshotting import group_state
from streamrec.samples import Sample
from streamrec.snapshots.store import SnapshotStore
from tests.support import small_tables

CFG = ModelConfig.model_validate(
    {
        "tables": small_tables(1024, 32, dim=8),
        "sequence_length": 10,
        "attention_units": (16, 8),
        "mlp_units": (16, 8),
        "learning_rate": 1e-2,
        "train_batch_size": 32,
        "device": "cpu",
    }
)


def _batch(n: int, seed: int, t: int = 10) -> SampleColumns:
    """Synthetic samples; label = the target's category appears in the behaviour sequence."""
    rng = np.random.default_rng(seed)
    samples = []
    for k in range(n):
        seq = rng.integers(1, 1000, size=rng.integers(0, t + 1)).tolist()
        target = int(rng.integers(1, 1000))
        label = int(any(i % 31 == target % 31 for i in seq))
        samples.append(
            Sample(
                f"s{seed}-{k}", f"u{k % 7}", 1_000 + k, f"i{target}", f"c{target % 31}", label,
                tuple(f"i{i}" for i in seq), tuple(f"c{i % 31}" for i in seq),
            )
        )
    return SampleColumns.from_samples(samples)


def _tensors(encoded: EncodedColumns, model: DIN) -> tuple[Any, ...]:
    """The model's inputs (by feature, in plan order), with random dense features of the width it reads."""
    dense = np.random.default_rng(0).normal(size=(len(encoded), model.dense_dim)).astype(np.float32)
    return [paddle.to_tensor(a) for a in model_columns(encoded, model.plan)], paddle.to_tensor(dense)


def _awake(model: DIN) -> DIN:
    """The head's last layer starts at zero (the MLP adds nothing until trained): give it
    weights, so what reaches the head shows in the output.
    """
    last = model.head.mlp[-1]
    last.weight.set_value(np.random.default_rng(1).normal(size=last.weight.shape).astype(np.float32))
    return model


def test_din_logit_shape() -> None:
    paddle.seed(0)
    model = DIN(CFG)
    assert model(*_tensors(encode(_batch(5, 0), CFG), model)).shape == [5]


def test_an_untrained_din_scores_by_the_id_statistics_alone() -> None:
    """The head and the wide biases start at zero, and with ``match_init`` 0 the match weights
    too: the logit is the item's rate log-odds plus the user's centred one, as a counter would
    score (``match_init``'s default, 1, adds the category share: tests/unit/learner/test_din_match.py).
    """
    paddle.seed(0)
    model = DIN(CFG.model_copy(update={"match_init": 0.0}))
    inputs, dense = _tensors(encode(_batch(6, 1), CFG), model)
    logits = model(inputs, dense).numpy()
    rates = dense.numpy()
    np.testing.assert_allclose(logits, rates[:, 0] + rates[:, -2], rtol=1e-5, atol=1e-5)


def test_padding_positions_do_not_change_the_output() -> None:
    paddle.seed(0)
    model = _awake(DIN(CFG))
    model.eval()
    encoded = encode(_batch(6, 1), CFG)
    inputs, dense = _tensors(encoded, model)
    keys = model.plan.keys
    items, cats = keys.index("item/sequence"), keys.index("category/sequence")

    def score(item_rows: np.ndarray, category_rows: np.ndarray) -> np.ndarray:
        given = list(inputs)
        given[items], given[cats] = paddle.to_tensor(item_rows), paddle.to_tensor(category_rows)
        return model(given, dense).numpy()

    base = model(inputs, dense).numpy()
    # Garbage categories under padded items: the mask must hide them entirely.
    noisy_cats = np.where(encoded.sequences["item"] == 0, 5, encoded.sequences["category"])
    noisy = score(encoded.sequences["item"], noisy_cats)
    np.testing.assert_allclose(noisy, base, rtol=1e-6, atol=1e-6)
    shifted = score(encoded.sequences["item"], noisy_cats + 1)
    assert not np.allclose(shifted, base)  # a real behaviour's category does count
    # Extra left padding (a longer T) changes nothing either.
    pad = np.zeros((6, 4), dtype=np.int64)
    wider = score(
        np.hstack([pad, encoded.sequences["item"]]), np.hstack([pad + 3, encoded.sequences["category"]])
    )
    np.testing.assert_allclose(wider, base, rtol=1e-6, atol=1e-6)


def test_predict_many_returns_probabilities_in_chunks() -> None:
    learner = DINLearner(CFG)
    probs = learner.predict_many(_batch(300, 3))  # several chunks of 4 * 32
    assert probs.shape == (300,) and probs.dtype == np.float64
    assert ((probs > 0) & (probs < 1)).all()
    assert learner.predict_many(_batch(0, 3)).shape == (0,)


def test_learn_many_reduces_loss_on_a_learnable_problem() -> None:
    learner = DINLearner(CFG)
    train = _batch(512, 4)
    losses = [learner.learn_many(train).loss for _ in range(6)]
    assert losses[-1] < 0.8 * losses[0]


def test_a_user_table_trains_beside_the_behaviour_tables() -> None:
    user = {"name": "user", "feature": "user", "rows": 64, "dim": 4}
    cfg = ModelConfig.model_validate({**CFG.model_dump(), "tables": [*small_tables(1024, 32, dim=8), user]})
    learner = DINLearner(cfg)
    batch = _batch(64, 5)
    before = learner.state_arrays()["model/model.embedding.tables.user.weight"].copy()
    assert np.isfinite(learner.learn_many(batch).loss)
    after = learner.state_arrays()["model/model.embedding.tables.user.weight"]
    assert after.shape == (64, 4) and not np.array_equal(before, after)


def test_learn_many_on_empty_batch_is_nan_and_a_no_op() -> None:
    learner = DINLearner(CFG)
    before = learner.predict_many(_batch(10, 6))
    result = learner.learn_many(_batch(0, 6))
    assert np.isnan(result.loss) and (result.steps, result.skipped_steps) == (0, 0)
    np.testing.assert_array_equal(learner.predict_many(_batch(10, 6)), before)


def test_same_seed_same_predictions_other_seed_differs() -> None:
    data, probe = _batch(200, 7), _batch(50, 8)
    first, second = DINLearner(CFG), DINLearner(CFG)
    first.learn_many(data)
    second.learn_many(data)
    np.testing.assert_array_equal(first.predict_many(probe), second.predict_many(probe))
    other = DINLearner(CFG.model_copy(update={"seed": 1}))
    other.learn_many(data)
    assert not np.allclose(other.predict_many(probe), first.predict_many(probe))


def test_state_round_trip_resumes_training_identically() -> None:
    first_data, next_data, probe = _batch(200, 9), _batch(200, 10), _batch(50, 11)
    original = DINLearner(CFG)
    original.learn_many(first_data)
    # Through safetensors bytes, as the snapshot writer stores them; another seed proves
    # nothing of the restored learner's own initialisation survives.
    arrays = st_load(st_save(original.state_arrays()))
    restored = DINLearner(CFG.model_copy(update={"seed": 3}))
    restored.load_state_arrays(arrays)
    np.testing.assert_array_equal(restored.predict_many(probe), original.predict_many(probe))
    np.testing.assert_array_equal(restored.is_known(probe), original.is_known(probe))
    assert original.learn_many(next_data) == restored.learn_many(next_data)
    np.testing.assert_array_equal(restored.predict_many(probe), original.predict_many(probe))


def test_round_trip_without_optimizer_state_would_diverge() -> None:
    """Guards the test above: the Adam slots really matter for the next step."""
    data, probe = _batch(200, 12), _batch(50, 13)
    original = DINLearner(CFG)
    original.learn_many(data)
    arrays = original.state_arrays()
    fresh = DINLearner(CFG).state_arrays()
    partial = {k: (fresh[k] if k.startswith(OPTIMIZER_PREFIX) else v) for k, v in arrays.items()}
    restored = DINLearner(CFG)
    restored.load_state_arrays(partial)
    original.learn_many(data)
    restored.learn_many(data)
    assert not np.array_equal(restored.predict_many(probe), original.predict_many(probe))


def test_state_keys_are_structured_and_complete() -> None:
    learner = DINLearner(CFG)
    arrays = learner.state_arrays()
    params = [k for k in arrays if k.startswith("model/model.")]
    assert {"model/stats/item/samples", "model/stats/user/positives"} <= set(arrays)
    assert "model/model.embedding.tables.item.weight" in params
    assert arrays["model/model.embedding.tables.item.weight"].shape == (1024, 8)
    for key in params:
        name = key.removeprefix("model/")
        for slot in ("moment1", "moment2", "beta1_pow_acc", "beta2_pow_acc"):
            assert f"{OPTIMIZER_PREFIX}{name}/{slot}" in arrays
    assert not any("linear_" in k or "embedding_" in k for k in arrays)
    assert arrays["state/known_items"].dtype == np.uint8
    assert all(a.dtype != object for a in arrays.values())


def test_load_rejects_missing_keys_and_wrong_shapes() -> None:
    learner = DINLearner(CFG)
    arrays = learner.state_arrays()
    with pytest.raises(SnapshotError, match="missing"):
        learner.load_state_arrays({k: v for k, v in arrays.items() if k != "state/known_items"})
    bad = {**arrays, "model/model.embedding.tables.item.weight": np.zeros((10, 8), np.float32)}
    with pytest.raises(SnapshotError, match="shape"):
        learner.load_state_arrays(bad)


def test_a_snapshot_file_round_trips_without_pickle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes real snapshot files, then reads them back with every unpickler disabled."""
    original = DINLearner(CFG)
    original.learn_many(_batch(100, 15))
    store = SnapshotStore(tmp_path)
    store.write(group_state(original.state_arrays()), micro_batches=1, samples_trained=100, positions=())

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("pickle used")

    for name in ("dump", "dumps", "load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(paddle, "save", refuse)
    monkeypatch.setattr(paddle, "load", refuse)
    manifest, tensors = store.load(1)
    assert set(manifest.files) == {"model.safetensors", "optimizer.safetensors", "state.safetensors"}
    for name in manifest.files:  # safetensors: an 8-byte header length, then a JSON header
        head = (store.path(1) / name).read_bytes()[8:9]
        assert head == b"{", name
    restored = DINLearner(CFG)
    restored.load_state_arrays({f"{g}/{k}": v for g, arrays in tensors.items() for k, v in arrays.items()})
    probe = _batch(20, 16)
    np.testing.assert_array_equal(restored.predict_many(probe), original.predict_many(probe))


def test_items_become_known_once_learnt() -> None:
    learner = DINLearner(CFG.model_copy(update={"tables": tuple(
        t.model_copy(update={"min_count": 1}) for t in CFG.tables
    )}))
    batch = _batch(20, 14)
    assert not learner.is_known(batch).any()
    learner.learn_many(batch)
    known = learner.is_known(batch)
    assert known.all() and known.dtype == bool
    assert learner.known_items[0] == 0  # padding is never an item
    unseen = SampleColumns.from_samples([Sample("x", "u", 1, "never-seen", "c", 1, (), ())])
    assert learner.is_known(unseen).tolist() == [False]


def test_resolve_device(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_device("cpu") == "cpu"
    monkeypatch.setattr(din_module.paddle.device, "is_compiled_with_cuda", lambda: False)
    assert resolve_device("auto") == "cpu"
    with pytest.raises(ConfigError, match="STREAMREC_MODEL__DEVICE=gpu:1: this Paddle is built without CUDA"):
        resolve_device("gpu:1")
    monkeypatch.setattr(din_module.paddle.device, "is_compiled_with_cuda", lambda: True)
    assert resolve_device("gpu:1") == "gpu:1"
    monkeypatch.setattr(din_module.paddle.device.cuda, "device_count", lambda: 1)
    assert resolve_device("auto") == "gpu:0"
    monkeypatch.setattr(din_module.paddle.device.cuda, "device_count", lambda: 0)
    assert resolve_device("auto") == "cpu"


# --- non-finite training: a poisoned step is skipped, never applied ---------------------------

# The non-finite guards are checked on hashed tables: with dynamic ones, ids admitted before
# training get rows copied from the default row, a change of weights that is not a step.
HASHED = CFG.model_copy(update={"tables": tuple(t.model_copy(update={"ids": "hashed"}) for t in CFG.tables)})
HEAD_WEIGHT = "model/model.head.mlp.0.weight"
ITEM_WEIGHT = "model/model.embedding.tables.item.weight"


def _training_state(learner: DINLearner) -> dict[str, np.ndarray]:
    """What a step changes: parameters and Adam slots (copies); the id statistics count the
    data seen, trained on or not.
    """
    return {
        k: v.copy()
        for k, v in learner.state_arrays().items()
        if k.startswith(("model/model.", "optimizer/"))
    }


def _poison(learner: DINLearner, key: str, index: tuple[int, ...] | int) -> None:
    """Set ``key[index]`` to NaN, as a corrupt weight or a poisoned earlier step would."""
    arrays = learner.state_arrays()
    arrays[key][index] = np.nan
    learner.load_state_arrays(arrays)


def test_a_non_finite_loss_skips_every_step_and_leaves_the_weights_unchanged() -> None:
    learner = DINLearner(HASHED)
    _poison(learner, HEAD_WEIGHT, (0, 0))  # every sample's logit is NaN, so every loss is
    before = _training_state(learner)
    result = learner.learn_many(_batch(100, 20))
    assert (result.steps, result.skipped_steps) == (4, 4)  # ceil(100 / 32)
    assert result.bad and np.isnan(result.loss)
    after = _training_state(learner)
    for key, array in before.items():
        np.testing.assert_array_equal(after[key], array, err_msg=key)  # NaN equals NaN here


def test_a_nan_embedding_row_skips_only_the_steps_that_look_it_up() -> None:
    learner = DINLearner(HASHED)
    batch = _batch(100, 21)
    row = int(encode(batch, HASHED).targets["item"][0])
    _poison(learner, ITEM_WEIGHT, row)
    result = learner.learn_many(batch)
    assert result.bad and 0 < result.skipped_steps < result.steps
    assert np.isfinite(result.loss)  # the mean over the steps taken
    after = _training_state(learner)
    assert np.isnan(after[ITEM_WEIGHT][row]).all()
    after[ITEM_WEIGHT] = np.delete(after[ITEM_WEIGHT], row, axis=0)
    for key, array in after.items():
        assert np.isfinite(array).all(), key  # the NaN never spread into another weight


def test_a_non_finite_gradient_with_a_finite_loss_skips_the_step() -> None:
    learner = DINLearner(HASHED)
    param = dict(learner.train_module.named_parameters())[HEAD_WEIGHT.removeprefix("model/")]
    hook = param.register_hook(lambda grad: grad * float("inf"))
    before = _training_state(learner)
    result = learner.learn_many(_batch(64, 22))
    hook.remove()
    assert (result.steps, result.skipped_steps) == (2, 2)
    after = _training_state(learner)
    for key, array in before.items():
        np.testing.assert_array_equal(after[key], array, err_msg=key)
    assert learner.learn_many(_batch(64, 22)).skipped_steps == 0  # healthy again without it


def test_a_healthy_batch_skips_nothing() -> None:
    result = DINLearner(CFG).learn_many(_batch(100, 23))
    assert (result.steps, result.skipped_steps, result.bad) == (4, 0, False)
    assert np.isfinite(result.loss)


def test_a_learner_refuses_what_is_not_its_input_naming_it() -> None:
    # Found by the Python-API tour: samples given as a list raised AttributeError "'list' object
    # has no attribute 'target_ids'" from deep in the encoding, a dict of settings "'dict' object
    # has no attribute 'tables'"; the contract takes SampleColumns and a ModelConfig.
    learner = DINLearner(CFG)
    samples = [Sample("e1", "u1", 1, "i1", "c1", 1, (), ())]
    for method in (learner.predict_many, learner.learn_many, learner.is_known):
        with pytest.raises(TypeError, match=r"SampleColumns\.from_samples\(samples\)\), not list"):
            method(samples)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cfg must be a ModelConfig .*, not dict"):
        DINLearner({"device": "cpu"})  # type: ignore[arg-type]


def test_scores_after_learning_a_batch_are_those_of_a_fresh_copy_of_it() -> None:
    # Found by the Python-API tour: learn_many(batch) then predict_many(batch) scored the batch
    # with its encoding from before training (the id statistics it had just counted left out):
    # [0.510, 0.499] against [0.676, 0.333] for the same samples as a new SampleColumns, or for a
    # learner restored from the same state.
    learner = DINLearner(CFG)
    batch = _batch(64, seed=5)
    for _ in range(3):
        learner.learn_many(batch)
    fresh = dataclasses.replace(batch)  # the same columns, another object: encoded afresh
    assert fresh is not batch
    np.testing.assert_array_equal(learner.predict_many(batch), learner.predict_many(fresh))
