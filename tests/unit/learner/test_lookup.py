"""Training's lookups: each distinct row looked up once, the same vectors and gradients."""

from __future__ import annotations

import numpy as np
import paddle

from streamrec.learner.model import distinct_lookup


def test_a_distinct_lookup_reads_the_same_vectors_and_sends_one_gradient_row_per_id() -> None:
    paddle.seed(0)
    table = paddle.nn.Embedding(10, 3, sparse=True, padding_idx=0)
    ids = paddle.to_tensor(np.array([[0, 3, 3], [5, 3, 0]]))
    weights = paddle.arange(18, dtype="float32").reshape([2, 3, 3])
    plain = table(ids)
    out = distinct_lookup(table, ids)
    np.testing.assert_array_equal(out.numpy(), plain.numpy())
    (out * weights).sum().backward()
    grad = table.weight.grad
    assert grad is not None
    assert list(grad.rows()) == [0, 3, 5]  # a plain lookup's: one per position, 6
    values = np.asarray(grad._get_tensor_from_selected_rows())
    w = weights.numpy()
    np.testing.assert_allclose(values[1], w[0, 1] + w[0, 2] + w[1, 1])  # id 3, three times
    np.testing.assert_allclose(values[2], w[1, 0])
    # padding's, as a plain lookup's: Paddle's row gradient does not leave padding out
    np.testing.assert_allclose(values[0], w[0, 0] + w[1, 2])
