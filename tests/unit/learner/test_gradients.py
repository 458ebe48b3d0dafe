"""The ranks' gradients averaged after a backward pass (`streamrec.learner.gradients`), without gloo.

The ranks' exchange is a stand-in here that hands every rank's packed gradients to each; the
collective runs across processes in ``tests/integration/learner/test_ranks.py``.
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from streamrec.config import ModelConfig
from streamrec.learner.columns import SampleColumns
from streamrec.learner.din import DINLearner
from streamrec.learner.gradients import Gradients, GradientSum, overwrite_rows
from streamrec.samples import Sample
from tests.support import small_tables

CFG = ModelConfig(tables=small_tables(2**8, 2**5, dim=4, ids="hashed"), sequence_length=4, mlp_units=[4])


def samples(n: int) -> list[Sample]:
    return [
        Sample(
            f"s{k}",
            f"u{k % 5}",
            1_000 + k,
            f"i{k % 7}",
            f"c{k % 3}",
            k % 2,
            tuple(f"i{j}" for j in range(k % 4)),
            tuple(f"c{j}" for j in range(k % 4)),
        )
        for k in range(n)
    ]


def backward(learner: DINLearner, batch: SampleColumns, scale: float) -> None:
    encoded = learner.encode(batch)
    learner.train_module.train()
    loss = learner.train_module(*learner._inputs(encoded), paddle.to_tensor(encoded.label))
    (loss * scale).backward()


def test_two_ranks_averaged_gradients_step_as_one_process_on_the_whole_mini_batch() -> None:
    whole = samples(16)
    ranks, one = [DINLearner(CFG), DINLearner(CFG)], DINLearner(CFG)
    for learner, share in zip(ranks, (whole[:6], whole[6:]), strict=True):
        # the loss scale as `GroupLayout.share` gives it
        backward(learner, SampleColumns.from_samples(share), 2 * len(share) / len(whole))
    backward(one, SampleColumns.from_samples(whole), 1.0)
    packed = [GradientSum(r.train_module, lambda a, w: []).mine().pack() for r in ranks]
    calls: list[str] = []

    def gather(array: np.ndarray, what: str) -> list[np.ndarray]:
        calls.append(what)
        return packed

    for learner in ranks:
        GradientSum(learner.train_module, gather)()
        learner._optimizer.step()
    one._optimizer.step()
    assert calls == ["gradients", "gradients"]  # one exchange a step
    expected = one.state_arrays()
    for learner in ranks:
        got = learner.state_arrays()
        for key in (k for k in expected if k.startswith("model/")):
            np.testing.assert_allclose(got[key], expected[key], rtol=1e-5, atol=1e-7, err_msg=key)
    assert any(not np.array_equal(expected[k], DINLearner(CFG).state_arrays()[k]) for k in expected)


def test_packed_gradients_come_back_as_they_were() -> None:
    grads = Gradients(
        dense=[np.arange(6, dtype=np.float32).reshape(2, 3), None, np.array([0.5], np.float32)],
        rows=[np.array([3, 1, 3]), np.zeros(0, np.int64)],
        values=[np.arange(6, dtype=np.float32).reshape(3, 2), np.zeros((0, 1), np.float32)],
    )
    back = Gradients.unpack(grads.pack(), [(2, 3), (4,), (1,)], [2, 1])
    assert back.dense[1] is None
    pairs = [
        *zip(back.dense[::2], grads.dense[::2], strict=True),
        *zip(back.rows, grads.rows, strict=True),
        *zip(back.values, grads.values, strict=True),
    ]
    for got, want in pairs:
        np.testing.assert_array_equal(got, want)


def test_the_mean_sums_dense_gradients_and_concatenates_rows_in_rank_order_over_the_ranks() -> None:
    a = Gradients([np.ones(2, np.float32), None], [np.array([1])], [np.array([[4.0]], np.float32)])
    b = Gradients(
        [np.full(2, 3, np.float32), None], [np.array([1, 2])], [np.array([[2.0], [6.0]], np.float32)]
    )
    mean = Gradients.mean([a, b])
    assert mean.dense[0] is not None and mean.dense[0].tolist() == [2.0, 2.0] and mean.dense[1] is None
    assert mean.rows[0].tolist() == [1, 1, 2] and mean.values[0].ravel().tolist() == [2.0, 1.0, 3.0]


def test_the_mean_writes_dense_averages_into_the_arrays_it_is_given() -> None:
    # `GradientSum` gives its live gradients (views): the average lands there, nothing to set.
    a = Gradients([np.ones(2, np.float32), np.ones(1, np.float32)], [], [])
    b = Gradients([np.full(2, 3, np.float32), np.full(1, 5, np.float32)], [], [])
    live = np.zeros(2, np.float32)
    mean = Gradients.mean([a, b], into=[live, None])
    assert mean.dense[0] is live and live.tolist() == [2.0, 2.0]
    assert mean.dense[1] is not None and mean.dense[1].tolist() == [3.0]
    assert a.dense[0] is not None and a.dense[0].tolist() == [1.0, 1.0]  # the ranks' own untouched


def test_the_averaged_dense_gradients_are_the_parameters_own_after_the_exchange() -> None:
    learner = DINLearner(CFG)
    backward(learner, SampleColumns.from_samples(samples(16)), 1.0)
    sums = GradientSum(learner.train_module, lambda a, w: [])
    mine = sums.mine()
    before = [None if g is None else g.copy() for g in mine.dense]
    tripled = Gradients([None if g is None else g * 3 for g in before], mine.rows, mine.values).pack()
    GradientSum(learner.train_module, lambda a, w: [a.copy(), tripled])()
    after = sums.mine().dense
    assert any(g is not None for g in before)
    for got, g in zip(after, before, strict=True):
        if g is not None:
            assert got is not None
            np.testing.assert_allclose(got, 2 * g, rtol=1e-6)  # (g + 3g) / 2


def test_gradients_of_another_model_are_refused() -> None:
    packed = Gradients([np.ones(5, np.float32)], [], []).pack()
    with pytest.raises(ValueError, match="not the 3 of this model"):
        Gradients.unpack(packed, [(3,)], [])


def test_a_sparse_gradient_outside_an_embedding_layer_is_refused() -> None:
    module = paddle.nn.Linear(4, 2)
    paddle.nn.functional.embedding(paddle.to_tensor([1, 3]), module.weight, sparse=True).sum().backward()
    with pytest.raises(TypeError, match="nn.Embedding"):
        GradientSum(module, lambda a, w: [a]).mine()


def test_row_gradients_overwritten_in_place_step_as_the_surrogate_backward_pass_makes_them() -> None:
    # `GradientSum.set` writes a row gradient where the backward pass left one (`overwrite_rows`)
    # and builds it by a surrogate backward pass where there is none: the optimizer steps alike.
    batch = SampleColumns.from_samples(samples(16))
    in_place, surrogate = DINLearner(CFG), DINLearner(CFG)
    backward(in_place, batch, 1.0)
    sums = [GradientSum(learner.train_module, lambda a, w: []) for learner in (in_place, surrogate)]
    mean = Gradients.mean([sums[0].mine(), sums[0].mine()])
    written = []
    for p, rows, values in zip(sums[0]._sparse, mean.rows, mean.values, strict=True):
        written.append(overwrite_rows(p, rows, values))
    assert all(written)  # every table's row gradient was there to overwrite
    assert all(p.grad is None for p in sums[1]._sparse)  # none: the surrogate's path
    sums[1].set(mean)
    for learner in (in_place, surrogate):
        learner._optimizer.step()
    got, expected = in_place.state_arrays(), surrogate.state_arrays()
    keys = [k for k in expected if k.startswith("model/")]
    assert any("tables" in k for k in keys) and any("biases" in k for k in keys)
    for key in keys:
        np.testing.assert_array_equal(got[key], expected[key], err_msg=key)
