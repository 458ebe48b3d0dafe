"""Training's lookups: each distinct row looked up once, the same vectors and gradients."""

from __future__ import annotations

from typing import Any

import numpy as np
import paddle
import pytest

from streamrec.config import ModelConfig
from streamrec.learner import embedding, model
from streamrec.learner.embedding import distinct_keys, distinct_lookup


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


def _tables() -> list[paddle.nn.Embedding]:
    paddle.seed(1)
    return [paddle.nn.Embedding(n, 3, sparse=True, padding_idx=0) for n in (10, 7)]


def _dense_grad(table: paddle.nn.Embedding) -> np.ndarray:
    grad = table.weight.grad
    assert grad is not None
    out = np.zeros(table.weight.shape, np.float32)
    np.add.at(out, np.asarray(grad.rows()), np.asarray(grad._get_tensor_from_selected_rows()))
    return out


@pytest.mark.parametrize("huge", [False, True])
def test_distinct_keys_are_the_plain_lookups_concatenated_with_the_same_gradients(
    huge: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if huge:  # tables too large for one mixed-radix key: the tuples are made distinct by rows
        monkeypatch.setattr(embedding, "TUPLE_KEY_LIMIT", 69)
    targets = [paddle.to_tensor(np.array([3, 9])), paddle.to_tensor(np.array([1, 6]))]
    sequences = [
        paddle.to_tensor(np.array([[3, 3, 0], [5, 9, 0]])),
        paddle.to_tensor(np.array([[1, 2, 0], [6, 6, 0]])),
    ]
    weights = paddle.arange(2 * 3 * 7, dtype="float32").reshape([2, 3, 7])
    plain = _tables()
    target = paddle.concat([plain[i](targets[i]) for i in range(2)], axis=-1)
    along = [plain[i](sequences[i]) for i in range(2)]
    keys = paddle.concat([*along, paddle.ones([2, 3, 1])], axis=-1)
    ((keys * weights).sum() + (target * weights[:, 0, :6]).sum()).backward()
    tables = _tables()
    target2, keys2 = distinct_keys(tables, targets, sequences)
    np.testing.assert_array_equal(target2.numpy(), target.numpy())
    np.testing.assert_array_equal(keys2.numpy(), keys.numpy())
    ((keys2 * weights).sum() + (target2 * weights[:, 0, :6]).sum()).backward()
    for a, b in zip(plain, tables, strict=True):
        np.testing.assert_allclose(_dense_grad(b), _dense_grad(a), rtol=1e-6)


def test_scoring_reads_the_keys_by_distinct_tuples_with_the_same_scores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = ModelConfig(
        tables=[
            {"name": "item", "feature": "item", "rows": 64, "dim": 4},
            {"name": "category", "feature": "category", "ids": "hashed", "rows": 16, "dim": 4},
        ],
        sequence_length=5,
        attention_units=(8,),
        mlp_units=(8,),
    )
    paddle.seed(0)
    din = model.DIN(cfg)
    din.eval()
    rng = np.random.default_rng(0)
    targets = [paddle.to_tensor(rng.integers(1, n, 6)) for n in (64, 16)]
    sequences = [paddle.to_tensor(rng.integers(0, n, (6, 5))) for n in (64, 16)]
    dense = paddle.to_tensor(rng.random((6, din.dense_dim)).astype(np.float32))
    calls: list[int] = []

    def counted(*args: Any) -> tuple[paddle.Tensor, paddle.Tensor]:
        calls.append(1)
        return distinct_keys(*args)

    monkeypatch.setattr(model, "distinct_keys", counted)
    with paddle.no_grad():
        fast = din([*targets, *sequences], dense).numpy()
        assert calls
        monkeypatch.setattr(model.DIN, "_distinct_keys", lambda self, ids: False)
        plain = din([*targets, *sequences], dense).numpy()
    np.testing.assert_array_equal(fast, plain)
