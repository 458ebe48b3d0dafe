"""The training step's finiteness check: over every gradient, dense and sparse, the values untouched."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from streamrec.learner.state import all_finite


def _tensors(bad: float | None) -> list[paddle.Tensor]:
    table = paddle.nn.Embedding(6, 2, sparse=True)
    (table(paddle.to_tensor(np.array([1, 4, 4]))) * 3.0).sum().backward()
    dense = np.array([[0.5, -2.0], [1e-40, 3.0]], np.float32)  # a denormal too
    if bad is not None:
        dense[1, 1] = bad
    assert table.weight.grad is not None
    return [paddle.to_tensor(np.float32(0.25)), paddle.to_tensor(dense), table.weight.grad]


def test_finite_tensors_pass_and_keep_their_values_bit_for_bit() -> None:
    tensors = _tensors(None)
    before = [
        np.asarray(t._get_tensor_from_selected_rows() if t.is_selected_rows() else t).copy() for t in tensors
    ]
    assert all_finite(tensors)
    after = [np.asarray(t._get_tensor_from_selected_rows() if t.is_selected_rows() else t) for t in tensors]
    for a, b in zip(before, after, strict=True):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_a_non_finite_value_anywhere_fails(bad: float) -> None:
    assert not all_finite(_tensors(bad))
    tensors = _tensors(None)
    grad = tensors[2]._get_tensor_from_selected_rows()
    grad.set_value(np.full(grad.shape, bad, np.float32))
    assert not all_finite(tensors)


@pytest.mark.parametrize("big", [2e19, -1e25])
def test_a_gradient_whose_square_overflows_float32_fails(big: float) -> None:
    # Found by a tour of docs/your-features.md: a context number declared with the default
    # (identity) transform and sent as 1e30 gave a finite loss (4.6e25) and finite gradients,
    # but Adam's squared gradient overflowed: moment2 went inf, the learner refused to snapshot
    # ("5 state arrays hold NaN or infinite values") and redid the same samples on each restart.
    assert not all_finite(_tensors(big))
    assert all_finite(_tensors(1e19))  # squared, 1e38: still a float32
