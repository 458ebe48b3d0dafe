"""Tests for ``streamrec.learner.ewc`` and online EWC inside ``DINLearner``.

The penalty's value and gradient are checked against numpy on a tiny layer; the learner
tests check EWC's effect, its state through a real snapshot, and that lambda 0 is plain
fine-tuning.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import paddle
import pytest
from paddle import nn

from streamrec.errors import SnapshotError
from streamrec.learner.din import EWC_PREFIX, DINLearner
from streamrec.learner.ewc import OnlineEWC
from streamrec.learner.snapshotting import group_state
from streamrec.snapshots.store import SnapshotStore
from tests.unit.learner.test_din import CFG, _batch

EWC = CFG.model_copy(update={"ewc_lambda": 10.0})
TABLE = "table.weight"


class _Tiny(nn.Layer):
    """A sparse 10 x 3 table and a dense 3 -> 1 layer: the shapes EWC meets in DIN."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(10, 3, sparse=True)
        self.dense = nn.Linear(3, 1)

    def forward(self, ids: paddle.Tensor) -> paddle.Tensor:
        return self.dense(self.table(ids)).sum()


def _tiny(lam: float = 2.0, gamma: float = 0.5, normalise: bool = False) -> tuple[_Tiny, OnlineEWC]:
    paddle.seed(0)
    model = _Tiny()
    params = dict(model.named_parameters())
    return model, OnlineEWC(params, frozenset({TABLE}), lam, gamma, normalise)


def _grads(model: _Tiny, ids: list[int]) -> dict[str, np.ndarray]:
    """Backward of the model on ``ids``; the dense gradients, by name (rows summed)."""
    model(paddle.to_tensor(ids)).backward()
    out = {}
    for name, param in model.named_parameters():
        grad = param.grad
        assert grad is not None
        if grad.is_selected_rows():
            dense = np.zeros(param.shape, np.float32)
            np.add.at(dense, np.asarray(grad.rows()), grad._get_tensor_from_selected_rows().numpy())
            out[name] = dense
        else:
            out[name] = grad.numpy()
    return out


def test_fisher_is_the_mean_squared_gradient_and_decays_by_gamma() -> None:
    model, ewc = _tiny()
    g1 = _grads(model, [1, 2, 2])
    ewc.accumulate()
    model.clear_gradients()
    g2 = _grads(model, [2, 5])
    ewc.accumulate()
    model.clear_gradients()
    ewc.consolidate(steps=2)
    first = {n: (g1[n] ** 2 + g2[n] ** 2) / 2 for n in g1}
    for name in g1:
        np.testing.assert_allclose(ewc.fisher[name].numpy(), first[name], rtol=1e-5)
    assert not ewc.fisher[TABLE].numpy()[[0, 3, 4, 6, 7, 8, 9]].any()  # untouched rows: no mass
    g3 = _grads(model, [7])
    ewc.accumulate()
    model.clear_gradients()
    ewc.consolidate(steps=1)
    for name in g1:
        np.testing.assert_allclose(ewc.fisher[name].numpy(), 0.5 * first[name] + g3[name] ** 2, rtol=1e-5)


def test_normalised_fisher_has_mean_one_over_what_the_micro_batch_touched() -> None:
    model, ewc = _tiny(normalise=True)
    _grads(model, [1, 4])
    ewc.accumulate()
    ewc.consolidate(steps=1)
    values = np.concatenate([f.numpy().ravel() for f in ewc.fisher.values()])
    assert values[values > 0].mean() == pytest.approx(1.0, rel=1e-5)


def test_no_penalty_before_the_first_anchor_or_with_lambda_zero() -> None:
    model, ewc = _tiny()
    assert ewc.penalty({TABLE: paddle.to_tensor([1])}) is None
    _, off = _tiny(lam=0.0)
    off.consolidate(steps=1)
    assert off.penalty({TABLE: paddle.to_tensor([1])}) is None


def test_penalty_value_and_gradient_cover_the_looked_up_rows_only() -> None:
    model, ewc = _tiny(lam=2.0)
    _grads(model, [1, 2, 3])
    ewc.accumulate()
    model.clear_gradients()
    ewc.consolidate(steps=1)
    anchor = {n: ewc.anchor[n].numpy().copy() for n in ewc.params}
    fisher = {n: ewc.fisher[n].numpy() for n in ewc.params}
    # Move every weight, then take the penalty over rows 2 and 3 of the table.
    for param in model.parameters():
        param.set_value(param.numpy() + 0.1 * np.arange(param.size, dtype=np.float32).reshape(param.shape))
    rows = [2, 3]
    penalty = ewc.penalty({TABLE: paddle.to_tensor(rows)})
    assert penalty is not None
    drift = {n: dict(model.named_parameters())[n].numpy() - anchor[n] for n in anchor}
    expected = sum(float((fisher[n] * drift[n] ** 2).sum()) for n in anchor if n != TABLE)
    expected += float((fisher[TABLE][rows] * drift[TABLE][rows] ** 2).sum())
    assert float(penalty) == pytest.approx(expected, rel=1e-5)  # lambda / 2 = 1
    penalty.backward()
    grad, dense = model.table.weight.grad, model.dense.weight.grad
    assert grad is not None and dense is not None
    assert grad.is_selected_rows() and sorted(set(np.asarray(grad.rows()).tolist())) == rows
    values = grad._get_tensor_from_selected_rows().numpy()
    np.testing.assert_allclose(values, 2.0 * fisher[TABLE][rows] * drift[TABLE][rows], rtol=1e-5)
    name = "dense.weight"
    np.testing.assert_allclose(dense.numpy(), 2.0 * fisher[name] * drift[name], rtol=1e-5)


def test_consolidate_anchors_the_updated_rows_at_the_current_weights() -> None:
    model, ewc = _tiny()
    before = model.table.weight.numpy().copy()
    _grads(model, [4])
    ewc.accumulate()
    model.table.weight.set_value(before + 1.0)  # as if every row moved; only row 4 was looked up
    ewc.consolidate(steps=1)
    anchor = ewc.anchor[TABLE].numpy()
    np.testing.assert_array_equal(anchor[4], before[4] + 1.0)
    np.testing.assert_array_equal(np.delete(anchor, 4, axis=0), np.delete(before, 4, axis=0))


def test_reset_rows_forgets_their_fisher_and_reanchors_them() -> None:
    model, ewc = _tiny()
    _grads(model, [1, 2])
    ewc.accumulate()
    ewc.consolidate(steps=1)
    model.table.weight.set_value(model.table.weight.numpy() + 5.0)
    ewc.reset_rows(TABLE, np.array([2]))
    assert not ewc.fisher[TABLE].numpy()[2].any() and ewc.fisher[TABLE].numpy()[1].any()
    np.testing.assert_array_equal(ewc.anchor[TABLE].numpy()[2], model.table.weight.numpy()[2])


def test_lambda_zero_is_plain_fine_tuning() -> None:
    plain, zero = DINLearner(CFG), DINLearner(CFG.model_copy(update={"ewc_lambda": 0.0}))
    for seed in (20, 21):
        assert plain.learn_many(_batch(200, seed)) == zero.learn_many(_batch(200, seed))
    assert not any(k.startswith(EWC_PREFIX) for k in zero.state_arrays())


def test_ewc_reports_its_penalty_and_holds_the_weights_near_the_anchor() -> None:
    first, second = _batch(300, 22), _batch(300, 23)
    drift = {}
    for lam in (0.0, 1e4):
        learner = DINLearner(CFG.model_copy(update={"ewc_lambda": lam}))
        result = learner.learn_many(first)
        assert result.penalty == 0.0 and result.penalty_share == 0.0  # no anchor yet
        anchor = learner.state_arrays()
        result = learner.learn_many(second)
        after = learner.state_arrays()
        if lam:
            assert result.penalty > 0 and 0 < result.penalty_share < 1
        head = "model/model.head.mlp.0.weight"
        drift[lam] = float(np.abs(after[head] - anchor[head]).sum())
    assert drift[1e4] < 0.5 * drift[0.0]


def test_ewc_state_round_trips_through_a_snapshot_and_resumes_identically(tmp_path: Path) -> None:
    original = DINLearner(EWC)
    original.learn_many(_batch(200, 24))
    store = SnapshotStore(tmp_path)
    store.write(group_state(original.state_arrays()), micro_batches=1, samples_trained=200, positions=())
    manifest, tensors = store.load(1)
    assert "ewc.safetensors" in manifest.files
    restored = DINLearner(EWC.model_copy(update={"seed": 5}))
    restored.load_state_arrays({f"{g}/{k}": v for g, arrays in tensors.items() for k, v in arrays.items()})
    follow = _batch(200, 25)
    again, resumed = original.learn_many(follow), restored.learn_many(follow)
    assert again == resumed and again.penalty > 0
    probe = _batch(40, 26)
    np.testing.assert_array_equal(original.predict_many(probe), restored.predict_many(probe))


def test_ewc_can_be_switched_on_or_off_across_a_restart() -> None:
    plain = DINLearner(CFG)
    plain.learn_many(_batch(200, 27))
    switched_on = DINLearner(EWC)
    switched_on.load_state_arrays(plain.state_arrays())  # no EWC state: starts afresh
    assert switched_on.learn_many(_batch(200, 28)).penalty == 0.0  # anchored, no Fisher yet
    assert switched_on.learn_many(_batch(200, 29)).penalty > 0
    switched_off = DINLearner(CFG)
    switched_off.load_state_arrays(switched_on.state_arrays())  # EWC state ignored
    assert switched_off.learn_many(_batch(200, 30)).penalty == 0.0


def test_ewc_state_of_another_shape_is_refused() -> None:
    learner = DINLearner(EWC)
    arrays = learner.state_arrays()
    key = f"{EWC_PREFIX}fisher/model.embedding.tables.item.weight"
    with pytest.raises(SnapshotError, match="shape"):
        learner.load_state_arrays({**arrays, key: np.zeros((3, 8), np.float32)})
    with pytest.raises(SnapshotError, match="missing"):
        learner.load_state_arrays({k: v for k, v in arrays.items() if k != key})
