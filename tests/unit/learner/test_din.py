"""Tests for ``streamrec.learner.model`` and ``streamrec.learner.din``.

Small tables (1024 item buckets) and tiny MLPs keep the whole file fast on two CPU cores.
"""

from __future__ import annotations

import pickle

import numpy as np
import paddle
import pytest
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from streamrec.config import ModelConfig
from streamrec.errors import SnapshotError
from streamrec.learner import din as din_module
from streamrec.learner.batch import Batch
from streamrec.learner.din import OPTIMIZER_PREFIX, DINLearner, resolve_device
from streamrec.learner.model import DIN, DINTrain, Penalty

CFG = ModelConfig(
    item_buckets=1024,
    category_buckets=32,
    embedding_dim=8,
    sequence_length=10,
    attention_units=(16, 8),
    mlp_units=(16, 8),
    learning_rate=1e-2,
    train_batch_size=32,
    device="cpu",
)


def _batch(n: int, seed: int, t: int = 10) -> Batch:
    """Synthetic rows; label = the target's category appears in the behaviour sequence."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, t + 1, size=n)
    seq_items = rng.integers(1, 1024, size=(n, t))
    seq_items[np.arange(t)[None, :] < (t - lengths)[:, None]] = 0
    seq_cats = np.where(seq_items > 0, seq_items % 31 + 1, 0)
    target_item = rng.integers(1, 1024, size=n)
    target_cat = target_item % 31 + 1
    label = (seq_cats == target_cat[:, None]).any(axis=1).astype(np.float32)
    users = np.array([f"u{k % 7}" for k in range(n)])
    return Batch(target_item, target_cat, seq_items, seq_cats, label, users)


def _tensors(batch: Batch) -> list[paddle.Tensor]:
    arrays = (batch.target_item, batch.target_category, batch.seq_items, batch.seq_categories)
    return [paddle.to_tensor(a) for a in arrays]


def test_din_logit_shape() -> None:
    paddle.seed(0)
    model = DIN(CFG)
    assert model(*_tensors(_batch(5, 0))).shape == [5]


def test_padding_positions_do_not_change_the_output() -> None:
    paddle.seed(0)
    model = DIN(CFG)
    model.eval()
    batch = _batch(6, 1)
    base = model(*_tensors(batch)).numpy()
    # Garbage categories under padded items: the mask must hide them entirely.
    noisy_cats = np.where(batch.seq_items == 0, 5, batch.seq_categories)
    ids = _tensors(batch)
    noisy = model(ids[0], ids[1], ids[2], paddle.to_tensor(noisy_cats)).numpy()
    np.testing.assert_allclose(noisy, base, rtol=1e-6, atol=1e-6)
    # Extra left padding (a longer T) changes nothing either.
    pad = np.zeros((6, 4), dtype=np.int64)
    wider = model(
        ids[0],
        ids[1],
        paddle.to_tensor(np.hstack([pad, batch.seq_items])),
        paddle.to_tensor(np.hstack([pad + 3, batch.seq_categories])),
    ).numpy()
    np.testing.assert_allclose(wider, base, rtol=1e-6, atol=1e-6)


class _ConstantPenalty(Penalty):
    def forward(self, model: DIN) -> paddle.Tensor:
        return paddle.to_tensor(2.5)


def test_train_wrapper_adds_penalties_to_the_loss() -> None:
    paddle.seed(0)
    model = DIN(CFG)
    batch = _batch(8, 2)
    args = [*_tensors(batch), paddle.to_tensor(batch.label)]
    plain = float(DINTrain(model)(*args))
    penalised = float(DINTrain(model, [_ConstantPenalty()])(*args))
    assert penalised == pytest.approx(plain + 2.5, rel=1e-6)


def test_predict_many_returns_probabilities_in_chunks() -> None:
    learner = DINLearner(CFG)
    probs = learner.predict_many(_batch(300, 3))  # several chunks of 4 * 32
    assert probs.shape == (300,) and probs.dtype == np.float64
    assert ((probs > 0) & (probs < 1)).all()
    assert learner.predict_many(_batch(0, 3)).shape == (0,)


def test_learn_many_reduces_loss_on_a_learnable_problem() -> None:
    learner = DINLearner(CFG)
    train = _batch(512, 4)
    losses = [learner.learn_many(train) for _ in range(6)]
    assert losses[-1] < 0.8 * losses[0]


def test_learn_many_calls_keepalive_after_every_step() -> None:
    learner = DINLearner(CFG.model_copy(update={"passes": 2}))
    calls: list[int] = []
    learner.learn_many(_batch(100, 5), keepalive=lambda: calls.append(1))
    assert len(calls) == 2 * 4  # ceil(100 / 32) mini-batches per pass


def test_learn_many_on_empty_batch_is_nan_and_a_no_op() -> None:
    learner = DINLearner(CFG)
    before = learner.predict_many(_batch(10, 6))
    assert np.isnan(learner.learn_many(_batch(0, 6)))
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
    original.update_known(first_data)
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
    params = [k for k in arrays if k.startswith("param/")]
    assert "param/model.embedding.item.weight" in params
    assert arrays["param/model.embedding.item.weight"].shape == (1024, 8)
    for key in params:
        name = key.removeprefix("param/")
        for slot in ("moment1", "moment2", "beta1_pow_acc", "beta2_pow_acc"):
            assert f"{OPTIMIZER_PREFIX}{name}/{slot}" in arrays
    assert not any("linear_" in k or "embedding_" in k for k in arrays)
    assert arrays["known_items"].dtype == np.uint8
    assert all(a.dtype != object for a in arrays.values())


def test_load_rejects_missing_keys_and_wrong_shapes() -> None:
    learner = DINLearner(CFG)
    arrays = learner.state_arrays()
    with pytest.raises(SnapshotError, match="missing"):
        learner.load_state_arrays({k: v for k, v in arrays.items() if k != "known_items"})
    bad = {**arrays, "param/model.embedding.item.weight": np.zeros((10, 8), np.float32)}
    with pytest.raises(SnapshotError, match="shape"):
        learner.load_state_arrays(bad)


def test_no_pickle_in_state_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("pickle used")

    for name in ("dump", "dumps", "load", "loads"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(paddle, "save", refuse)
    monkeypatch.setattr(paddle, "load", refuse)
    learner = DINLearner(CFG)
    learner.load_state_arrays(learner.state_arrays())


def test_known_items() -> None:
    learner = DINLearner(CFG)
    batch = _batch(20, 14)
    assert not learner.is_known(batch).any()
    learner.update_known(batch)
    assert learner.is_known(batch).all() and learner.is_known(batch).dtype == bool
    assert learner.known_items[0] == 0
    unseen = np.setdiff1d(np.arange(1, 1024), np.r_[batch.target_item, batch.seq_items.ravel()])
    probe = batch.take([0, 1])
    probe.target_item[:] = unseen[:2]
    assert learner.is_known(probe).tolist() == [False, False]


def test_resolve_device(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("gpu:1") == "gpu:1"
    monkeypatch.setattr(din_module.paddle.device, "is_compiled_with_cuda", lambda: False)
    assert resolve_device("auto") == "cpu"
    monkeypatch.setattr(din_module.paddle.device, "is_compiled_with_cuda", lambda: True)
    monkeypatch.setattr(din_module.paddle.device.cuda, "device_count", lambda: 1)
    assert resolve_device("auto") == "gpu:0"
    monkeypatch.setattr(din_module.paddle.device.cuda, "device_count", lambda: 0)
    assert resolve_device("auto") == "cpu"
