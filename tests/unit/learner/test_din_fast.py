"""The fast DIN forward (split attention, PReLU folded into the next Linear) equals the paper's.

Reference: the attention's scoring MLP run as ``nn.Sequential`` on the concatenation
[q, k, q-k, q*k] with Paddle's own PReLU, the weighted sum as multiply-and-sum, and the head
as ``nn.Sequential``; the same parameters. Scores and every gradient must agree to float
tolerance, with padding and with declared features (behaviour features along the sequence).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import paddle
import pytest
import threadpoolctl

from streamrec.features import FeatureSchema
from streamrec.learner import numpy_attention
from streamrec.learner.columns import SampleColumns
from streamrec.learner.din import DINLearner
from streamrec.learner.model import LocalActivationUnit, MLPHead, attention_first_layer, prelu_linear
from streamrec.learner.onnxforms import attention_first_layer_broadcast, onnx_forms, prelu_linear_row
from tests.unit.learner.test_features import SCHEMA, featured, model


def reference_attention(
    self: LocalActivationUnit, query: paddle.Tensor, keys: paddle.Tensor, mask: paddle.Tensor
) -> tuple[paddle.Tensor, paddle.Tensor]:
    """DIN's attention as the paper writes it (and the plain sum)."""
    keys = keys[:, :, :-1]  # the ones column
    q = query.unsqueeze(1).expand_as(keys)
    rows = paddle.concat([q, keys, q - keys, q * keys], axis=-1).reshape([-1, 4 * keys.shape[-1]])
    scores = self.score(rows).reshape(mask.shape)
    return ((scores * mask).unsqueeze(-1) * keys).sum(axis=1), (keys * mask.unsqueeze(-1)).sum(axis=1)


def reference_head(self: MLPHead, features: Sequence[paddle.Tensor]) -> paddle.Tensor:
    """The head as a plain ``nn.Sequential``."""
    return self.mlp(paddle.concat(list(features), axis=-1)).squeeze(-1)


def _scores_and_grads(learner: DINLearner, batch: SampleColumns) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    learner.train_module.train()
    encoded = learner.encode(batch)
    loss = learner.train_module(*learner._inputs(encoded), paddle.to_tensor(encoded.label))
    loss.backward()
    grads = {}
    for name, p in learner.train_module.named_parameters():
        if p.grad is not None:
            grads[name] = _dense(p.grad, p.shape)
    learner._optimizer.clear_grad()
    with paddle.no_grad():
        logits = learner.model(*learner._inputs(encoded)).numpy()
    return logits, grads


def _dense(grad: paddle.Tensor, shape: Sequence[int]) -> np.ndarray:
    """A gradient as a dense array (an embedding's sparse one summed into its rows)."""
    if not grad.is_selected_rows():
        return grad.numpy().copy()
    out = np.zeros(shape, np.float32)
    np.add.at(out, np.asarray(grad.rows()), grad._get_tensor_from_selected_rows().numpy())
    return out


def _count_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count `AttentionWeights`'s forward and backward calls, [forward, backward]."""
    calls = [0, 0]
    forward, backward = numpy_attention.AttentionWeights._forward, numpy_attention.AttentionWeights._backward
    score = numpy_attention.AttentionWeights.score

    def counted_forward(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return forward(*args, **kwargs)

    def counted_score(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return score(*args, **kwargs)

    def counted_backward(*args: Any) -> Any:
        calls[1] += 1
        return backward(*args)

    monkeypatch.setattr(numpy_attention.AttentionWeights, "_forward", staticmethod(counted_forward))
    monkeypatch.setattr(numpy_attention.AttentionWeights, "_backward", staticmethod(counted_backward))
    monkeypatch.setattr(numpy_attention.AttentionWeights, "score", staticmethod(counted_score))
    return calls


def test_the_numpy_form_holds_blas_to_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenBLAS's own default spins a thread per core between the small products (the module docstring)."""
    seen: list[int] = []
    forward = numpy_attention.AttentionWeights._forward

    def watched(*args: Any, **kwargs: Any) -> Any:
        seen.extend(i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas")
        return forward(*args, **kwargs)

    monkeypatch.setattr(numpy_attention.AttentionWeights, "_forward", staticmethod(watched))
    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        unit = LocalActivationUnit(4, (5, 3))
        keys = paddle.concat([paddle.randn([3, 2, 4]), paddle.ones([3, 2, 1])], axis=-1)
        unit(paddle.randn([3, 4]), keys, paddle.ones([3, 2]))
    assert seen and set(seen) == {1}


def test_the_blas_cap_is_entered_once_a_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """The BLAS cap (~30 µs to enter) is entered once per `learn_encoded` and `predict_encoded`."""
    seen: list[int] = []
    entered = [0]
    forward, limit = numpy_attention.AttentionWeights._forward, threadpoolctl.ThreadpoolController.limit

    def watched(*args: Any, **kwargs: Any) -> Any:
        seen.extend(i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas")
        return forward(*args, **kwargs)

    def counted(*args: Any, **kwargs: Any) -> Any:
        entered[0] += 1
        return limit(*args, **kwargs)

    monkeypatch.setattr(numpy_attention.AttentionWeights, "_forward", staticmethod(watched))
    monkeypatch.setattr(threadpoolctl.ThreadpoolController, "limit", counted)
    calls = _count_calls(monkeypatch)
    learner = DINLearner(model(attention_units=(8, 6), mlp_units=(8, 5), train_batch_size=4))
    batch = SampleColumns.from_samples(featured(12))
    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        entered[0] = 0  # the line above may use a controller's limit too
        learner.learn_many(batch)  # 3 steps, each a forward and a backward
        learner.predict_many(batch)
    assert calls[0] >= 4 and calls[1] == 3
    assert entered[0] == 2
    assert seen and set(seen) == {1}


def test_the_blas_cap_is_held_per_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another thread (an export scoring beside training) enters the cap itself, and the
    two threads' contexts never corrupt each other's count: a shared count could be left
    non-zero by a lost update, and then no later pass would be capped at all.
    """
    entered = [0]
    limit = threadpoolctl.ThreadpoolController.limit

    def counted(*args: Any, **kwargs: Any) -> Any:
        entered[0] += 1
        return limit(*args, **kwargs)

    monkeypatch.setattr(threadpoolctl.ThreadpoolController, "limit", counted)
    inside, leave = threading.Event(), threading.Event()

    def other() -> None:
        with numpy_attention.one_blas_thread():
            inside.set()
            leave.wait(5)

    with numpy_attention.one_blas_thread():
        worker = threading.Thread(target=other)
        worker.start()
        assert inside.wait(5)
        with numpy_attention.one_blas_thread():  # nested in this thread: free
            pass
        leave.set()
        worker.join(5)
    assert entered[0] == 2
    with numpy_attention.one_blas_thread():  # both left: the next pass is capped again
        assert entered[0] == 3


@pytest.mark.parametrize("top", [1.0, 1.5], ids=["slopes-at-most-1", "a-slope-above-1"])
def test_scoring_without_a_backward_equals_the_training_forward(top: float) -> None:
    """`AttentionWeights.score` (PReLU as max(x, a x), or by its derivative when a slope exceeds 1)."""
    rng = np.random.default_rng(7)
    unit = LocalActivationUnit(4, (6, 5))
    for p in unit.parameters():
        p.set_value(rng.normal(0, 0.5, p.shape).astype(np.float32))
    for layer in list(unit.score)[1::2]:  # the PReLUs: slopes from -0.5 to ``top``
        (slope,) = layer.parameters()
        slope.set_value(np.linspace(-0.5, top, slope.shape[0]).astype(np.float32))
    keys = paddle.concat([paddle.randn([3, 7, 4]), paddle.ones([3, 7, 1])], axis=-1)
    query, mask = paddle.randn([3, 4]), paddle.to_tensor([[1.0] * 7, [1.0] * 4 + [0.0] * 3, [0.0] * 7])
    trained = numpy_attention.pooled_history(query, keys, mask, list(unit.score)).numpy()
    with paddle.no_grad():
        scored = numpy_attention.pooled_history(query, keys, mask, list(unit.score)).numpy()
    np.testing.assert_allclose(scored, trained, rtol=1e-5, atol=1e-6)


def test_the_numpy_form_is_not_traced(monkeypatch: pytest.MonkeyPatch) -> None:
    """A traced graph (the export) keeps Paddle's form: numpy cannot be traced."""
    keys = paddle.ones([2, 3, 5])
    assert numpy_attention.usable(keys)
    monkeypatch.setattr(paddle, "in_dynamic_mode", lambda: False)
    assert not numpy_attention.usable(keys)


def _random_weights(learner: DINLearner, seed: int) -> None:
    """Non-trivial weights everywhere (the head's last layer starts at zero, slopes at 0.25)."""
    rng = np.random.default_rng(seed)
    for p in learner.train_module.parameters():
        p.set_value(rng.normal(0, 0.3, p.shape).astype(np.float32))


@pytest.mark.parametrize("in_numpy", [True, False], ids=["numpy", "paddle"])
@pytest.mark.parametrize("schema", [FeatureSchema.default(), SCHEMA], ids=["builtin", "declared"])
def test_the_fast_forward_equals_the_papers(
    schema: FeatureSchema, in_numpy: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both CPU forms of the attention's MLP: numpy's (`numpy_attention`) and Paddle's."""
    monkeypatch.setattr(numpy_attention, "ENABLED", in_numpy)
    calls = _count_calls(monkeypatch)
    learner = DINLearner(model(attention_units=(8, 6), mlp_units=(8, 5)), schema=schema)
    _random_weights(learner, 3)
    # Histories of 2 behaviours in a sequence of 4: padding on every sample.
    samples = featured(12)
    batch = SampleColumns.from_samples(samples)
    assert (learner.encode(batch).sequences["item"] == 0).any()
    fast, fast_grads = _scores_and_grads(learner, batch)
    assert calls == ([2, 1] if in_numpy else [0, 0])  # numpy's form trained and scored, or none did
    monkeypatch.setattr(LocalActivationUnit, "forward", reference_attention)
    monkeypatch.setattr(MLPHead, "forward", reference_head)
    slow, slow_grads = _scores_and_grads(learner, batch)
    np.testing.assert_allclose(fast, slow, rtol=1e-5, atol=1e-5)
    assert set(fast_grads) == set(slow_grads)
    for name, grad in slow_grads.items():
        np.testing.assert_allclose(fast_grads[name], grad, rtol=1e-4, atol=1e-5, err_msg=name)


def test_the_split_layers_on_random_inputs() -> None:
    paddle.seed(5)
    unit = LocalActivationUnit(6, (7, 3))
    for p in unit.parameters():
        p.set_value(np.random.default_rng(1).normal(0, 0.5, p.shape).astype(np.float32))
    query = paddle.randn([9, 6])
    keys = paddle.randn([9, 5, 6])
    first, prelu, linear = list(unit.score)[:3]
    q = query.unsqueeze(1).expand_as(keys)
    concat = paddle.concat([q, keys, q - keys, q * keys], axis=-1)
    np.testing.assert_allclose(
        attention_first_layer(first, query, paddle.concat([keys, paddle.ones([9, 5, 1])], axis=-1)).numpy(),
        first(concat).numpy(),
        rtol=1e-5,
        atol=1e-5,
    )
    hidden = first(concat).reshape([-1, 7])
    np.testing.assert_allclose(
        prelu_linear(hidden, prelu, linear).numpy(), linear(prelu(hidden)).numpy(), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("schema", [FeatureSchema.default(), SCHEMA], ids=["builtin", "declared"])
def test_the_onnx_forms_score_as_the_training_forms(schema: FeatureSchema) -> None:
    learner = DINLearner(model(attention_units=(8, 6), mlp_units=(8, 5)), schema=schema)
    batch = SampleColumns.from_samples(featured(12))
    learner.learn_many(batch)  # admits the items: each target its own row
    _random_weights(learner, 4)
    encoded = learner.encode(batch)
    learner.model.eval()
    with paddle.no_grad():
        trained = learner.model(*learner._inputs(encoded)).numpy()
        with onnx_forms(learner.model):
            assert learner.model.attention.onnx_form and learner.model.head.onnx_form
            served = learner.model(*learner._inputs(encoded)).numpy()
    assert not learner.model.attention.onnx_form and not learner.model.head.onnx_form
    np.testing.assert_allclose(served, trained, rtol=1e-5, atol=1e-6)
    assert np.ptp(trained) > 1e-3  # random weights: the scores differ, the head is not zero


def test_the_onnx_layers_on_random_inputs() -> None:
    paddle.seed(6)
    unit = LocalActivationUnit(6, (7, 1))
    for p in unit.parameters():
        p.set_value(np.random.default_rng(2).normal(0, 0.5, p.shape).astype(np.float32))
    first, prelu, last = list(unit.score)[:3]
    query = paddle.randn([9, 6])
    keys = paddle.concat([paddle.randn([9, 5, 6]), paddle.ones([9, 5, 1])], axis=-1)
    np.testing.assert_allclose(
        attention_first_layer_broadcast(first, query, keys).numpy(),
        attention_first_layer(first, query, keys).numpy(),
        rtol=1e-5,
        atol=1e-5,
    )
    hidden = paddle.randn([45, 7])
    np.testing.assert_allclose(
        prelu_linear_row(hidden, prelu, last).numpy(),
        prelu_linear(hidden, prelu, last).squeeze(-1).numpy(),
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize(
    "mask",
    [[[1.0] * 6] * 3, [[1.0] * 6, [0.0] * 2 + [1.0] * 4, [0.0] * 6], [[0.0] * 6] * 3],
    ids=["every-position-a-behaviour", "some-padding", "only-padding"],
)
def test_the_numpy_form_runs_the_behaviours_rows_only_with_the_papers_values(mask: list[list[float]]) -> None:
    """Padding's rows are dropped before the MLP and its weights restored as zeros.

    The same pooled values and gradients (query, keys, every parameter) as the paper's attention.
    """
    rng = np.random.default_rng(3)
    unit = LocalActivationUnit(4, (6, 5))
    for p in unit.parameters():
        p.set_value(rng.normal(0, 0.5, p.shape).astype(np.float32))
    keys_in = np.concatenate([rng.normal(size=(3, 6, 4)), np.ones((3, 6, 1))], axis=-1).astype(np.float32)
    query_in = rng.normal(size=(3, 4)).astype(np.float32)
    weights = paddle.to_tensor(rng.normal(size=(3, 2, 4)).astype(np.float32))
    results = []
    for form in ("numpy", "paper"):
        query = paddle.to_tensor(query_in, stop_gradient=False)
        keys = paddle.to_tensor(keys_in, stop_gradient=False)
        m = paddle.to_tensor(mask)
        if form == "numpy":
            pooled = numpy_attention.pooled_history(query, keys, m, list(unit.score))
        else:
            pooled = paddle.stack(reference_attention(unit, query, keys, m), axis=1)
        (pooled * weights).sum().backward()
        tensors = [query, keys, *unit.parameters()]
        grads = [_dense(t.grad, t.shape) for t in tensors if t.grad is not None]
        assert len(grads) == len(tensors)
        grads[1] = grads[1][:, :, :-1]  # the keys' ones column
        unit.clear_gradients()
        results.append((pooled.numpy(), grads))
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-5, atol=1e-5)
    for ours, theirs in zip(results[0][1], results[1][1], strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
