"""DIN attention's scoring MLP on the CPU in numpy: the same function, numpy's matrix products.

On the CPU the attention's MLP, run over every behaviour's [B*T, H] rows, is most of a training
step, and nearly all of that is matrix products; Paddle's CPU wheel multiplies at these shapes
at a third of numpy's OpenBLAS on the same core (measured, one thread, thread CPU:
[12,800 x 64] x [64 x 32] 26 against 83 GFLOP/s, the first layer's batched [50 x 17] x
[17 x 64] products 19 against 52). `AttentionWeights` is one `paddle.autograd.PyLayer` from
the query, the keys and the MLP's parameters to the history pooled by one weight per
behaviour (and plainly): forward and backward in numpy, written out by hand (the chain rule of
the first layer's per-sample weights, of batched matmuls and of (PReLU, Linear) pairs), so the
[B*T, H] rows never become Paddle tensors. Paddle sees one operator where the first layer's
per-sample weights and the pooling took ~25 and their gradients; the parameters and their
gradients are Paddle's as before.
Scoring (no gradient) skips the PyLayer and keeps nothing for a backward. After the first layer
the MLP runs on the behaviours' rows only (`_live`): padding's are weighted by zero and get no
gradient, so dropping them changes no value (MovieLens's mini-batches are 80% behaviours: the
bare training loop 1.02-1.10x, four alternate pairs).

It runs only in dygraph on the CPU (`usable`): a traced graph (the export) and a GPU keep
the Paddle form, `streamrec.learner.model.mlp_tail`. numpy's BLAS runs on one thread here, as
Paddle's does in the learner: OpenBLAS's own default (a thread per core) spins its threads
between these small products, and on two shared cores that doubled the learner's CPU time
for no gain (the benchmark's samples per CPU second, 2,271-2,303 against 4,039-4,075).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import paddle
from paddle import nn
from paddle.autograd import PyLayer
from threadpoolctl import ThreadpoolController

from streamrec.learner.onnxforms import prelu_slope

# Whether DIN's attention takes the numpy form where it can (tests switch it off to compare).
ENABLED = True

_BLAS: list[ThreadpoolController] = []  # found once, at the first use (it inspects the process)
# How many `one_blas_thread` contexts this thread has open: per thread, since an export may
# score beside the training thread (a shared count could lose an update and stay non-zero).
_HELD = threading.local()


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """A context in which numpy's BLAS runs on one thread; inside another one, it costs nothing.

    Entering threadpoolctl's limit and leaving it costs ~30 µs, so the learner holds it over a
    whole training pass or scoring pass (`streamrec.learner.steps`, `streamrec.learner.trainer`),
    and `AttentionWeights` enters it itself only when called outside one.
    """
    if getattr(_HELD, "depth", 0):
        yield
        return
    if not _BLAS:
        _BLAS.append(ThreadpoolController())
    with _BLAS[0].limit(limits=1, user_api="blas"):
        _HELD.depth = 1
        try:
            yield
        finally:
            _HELD.depth = 0


def usable(keys: paddle.Tensor) -> bool:
    """Whether the numpy form can run on ``keys``: enabled, in dygraph, on the CPU."""
    return ENABLED and paddle.in_dynamic_mode() and keys.place.is_cpu_place()


def pooled_history(
    query: paddle.Tensor, keys: paddle.Tensor, mask: paddle.Tensor, layers: Sequence[nn.Layer]
) -> paddle.Tensor:
    """The keys pooled by one weight per behaviour and plainly, [B, 2, D], by `AttentionWeights`.

    ``query`` [B, D], ``keys`` [B, T, D + 1] (`streamrec.learner.model.attention_first_layer`'s
    operands), ``mask`` [B, T] (1 for a behaviour, 0 for padding), ``layers`` the attention's MLP:
    its first Linear, then (PReLU, Linear) pairs, the last one unit wide.
    """
    first = layers[0]
    params: list[paddle.Tensor] = [first.weight, first.bias]
    for i in range(1, len(layers), 2):
        params += [prelu_slope(layers[i]), layers[i + 1].weight, layers[i + 1].bias]
    if not paddle.is_grad_enabled():  # scoring: nothing to keep for a backward
        with one_blas_thread():
            return AttentionWeights.score(query, keys, *params, mask=mask.numpy())
    return AttentionWeights.apply(query, keys, *params, mask=mask.numpy())


def _pool(weights: np.ndarray, mask: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[weights * mask, mask] [B, 2, T] and the keys (less their ones column) pooled by them, [B, 2, D]."""
    by = np.stack([weights * mask, mask], axis=1)
    return by, np.matmul(by, keys[:, :, :-1])


def _per_sample(q: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """The first layer as per-sample weights on the keys, [B, D + 1, H], from ``q`` [B, D].

    `streamrec.learner.model.first_layer_per_sample`'s function and form (its docstring derives
    it): [1, q] times a block matrix whose row 0 holds W2 - W3 and b, row 1 + i W4's row i in
    block i and W1 + W3's row i in block D. One product: 3.5x faster than a broadcast
    multiply-add of the same rows (0.14 against 0.49 ms at B = 256, D = 16, H = 64).
    """
    b, d, h = q.shape[0], q.shape[1], weight.shape[1]
    ones_q = np.empty((b, d + 1), np.float32)
    ones_q[:, 0], ones_q[:, 1:] = 1, q
    blocks = np.zeros((d + 1, d + 1, h), np.float32)
    blocks[0, :d] = weight[d : 2 * d] - weight[2 * d : 3 * d]
    blocks[0, d] = bias
    rows = np.arange(d)
    blocks[1 + rows, rows] = weight[3 * d :]
    blocks[1:, d] = weight[:d] + weight[2 * d : 3 * d]
    return np.matmul(ones_q, blocks.reshape(d + 1, -1)).reshape(b, d + 1, h)


def _per_sample_grads(q: np.ndarray, weight: np.ndarray, dp: np.ndarray) -> tuple[np.ndarray, ...]:
    """`_per_sample`'s chain rule: the gradients of ``q``, the weight and the bias from ``dp``."""
    d = q.shape[1]
    keys_part, query_part = dp[:, :d], dp[:, d]
    w4 = weight[3 * d :]
    w2 = keys_part.sum(axis=0)
    w1 = q.T @ query_part
    dw = np.concatenate([w1, w2, w1 - w2, np.einsum("bi,bih->ih", q, keys_part)])
    dq = np.einsum("bih,ih->bi", keys_part, w4) + query_part @ (weight[:d] + weight[2 * d : 3 * d]).T
    return dq, dw, query_part.sum(axis=0)


class AttentionWeights(PyLayer):
    """keys @ (the first layer per sample), (PReLU, Linear) pairs over the rows, the pooling; in numpy.

    See the module docstring. ``params``: the first Linear's weight and bias, then (slope,
    weight, bias) per pair; ``mask`` [B, T] (no gradient).
    """

    @staticmethod
    def score(
        query: paddle.Tensor, keys: paddle.Tensor, *params: paddle.Tensor, mask: np.ndarray
    ) -> paddle.Tensor:
        """`forward`'s weights without a backward: PReLU in two passes, nothing kept."""
        k = keys.numpy()
        first = [a.numpy() for a in params[:2]]
        live = _live(mask)
        x = _rows(np.matmul(k, _per_sample(query.numpy(), *first)), live)
        arrays = [a.numpy() for a in params[2:]]
        for i in range(0, len(arrays), 3):
            slope, weight, bias = arrays[i : i + 3]
            x = _times(_prelu(x, slope), weight)
            x += bias
        return paddle.to_tensor(_pool(_unrows(x, live, mask.size).reshape(mask.shape), mask, k)[1])

    @staticmethod
    def forward(
        ctx: Any, query: paddle.Tensor, keys: paddle.Tensor, *params: paddle.Tensor, mask: np.ndarray
    ) -> paddle.Tensor:
        """[B, 2, D]: the keys pooled by their weights and plainly."""
        with one_blas_thread():
            return AttentionWeights._forward(ctx, query, keys, *params, mask=mask)

    @staticmethod
    def _forward(
        ctx: Any, query: paddle.Tensor, keys: paddle.Tensor, *params: paddle.Tensor, mask: np.ndarray
    ) -> paddle.Tensor:
        """`forward`'s work."""
        q, k = query.numpy(), keys.numpy()
        first = [a.numpy() for a in params[:2]]
        p = _per_sample(q, *first)
        live = _live(mask)
        x = _rows(np.matmul(k, p), live)
        arrays = [a.numpy() for a in params[2:]]
        saved = []
        for i in range(0, len(arrays), 3):
            slope, weight, bias = arrays[i : i + 3]
            factor = _prelu_factor(x, slope)
            z = x * factor
            saved.append((x, factor, z))
            x = _times(z, weight)
            x += bias
        by, pooled = _pool(_unrows(x, live, mask.size).reshape(mask.shape), mask, k)
        ctx.arrays = (q, k, p, first[0], arrays, saved, mask, by, live)
        return paddle.to_tensor(pooled)

    @staticmethod
    def backward(ctx: Any, *grads: paddle.Tensor) -> tuple[paddle.Tensor, ...]:
        """Gradients of the query, the keys, the first Linear and every (slope, weight, bias)."""
        with one_blas_thread():
            return AttentionWeights._backward(ctx, grads[0])

    @staticmethod
    def _backward(ctx: Any, grad: paddle.Tensor) -> tuple[paddle.Tensor, ...]:
        """`backward`'s work; it never writes the saved arrays (a second backward sees them whole)."""
        q, k, p, first, arrays, saved, mask, by, live = ctx.arrays
        b, t = k.shape[0], k.shape[1]
        d_pooled = grad.numpy()
        # The pooling's chain rule: the weights' gradient (masked) and the keys' share of it.
        g = np.matmul(d_pooled[:, :1], k[:, :, :-1].transpose(0, 2, 1))[:, 0] * mask
        g = _rows(g[:, :, None], live)
        dk_pooled = np.matmul(by.transpose(0, 2, 1), d_pooled)
        ones = np.ones(len(g), np.float32)  # the biases' gradients as products: 7x faster than sum(axis=0)
        grads: list[np.ndarray] = []
        for i in range(len(saved) - 1, -1, -1):
            weight = arrays[3 * i + 1]
            x, factor, z = saved[i]
            neg = np.minimum(x, 0)
            if g.shape[1] == 1:
                # One unit wide: dz = g w^T, so the slope's gradient (the sum over rows of
                # dz * min(x, 0)) is w * (g^T min(x, 0)), a product, and dz is never built.
                slope_grad = weight[:, 0] * (g[:, 0] @ neg)
                g_in = factor * weight[:, 0]
                g_in *= g
            else:
                dz = g @ weight.T
                slope_grad = np.einsum("ij,ij->j", dz, neg)
                g_in = np.multiply(dz, factor, out=dz)
            grads = [slope_grad, z.T @ g, ones @ g, *grads]
            g = g_in
        dh = _unrows(g, live, b * t).reshape(b, t, -1)  # padding's rows: no gradient
        dk = np.matmul(dh, p.transpose(0, 2, 1))
        dk[:, :, :-1] += dk_pooled
        dq, dw, db = _per_sample_grads(q, first, np.matmul(k.transpose(0, 2, 1), dh))
        return tuple(paddle.to_tensor(a) for a in (dq, dk, dw, db, *grads))


def _live(mask: np.ndarray) -> np.ndarray | None:
    """The flat [B*T] positions that hold a behaviour, None when every one does.

    Padding's rows are weighted by zero in the pooling and get no gradient, so the MLP runs
    on the behaviours' rows only: on MovieLens's samples, 80% of the [B*T] positions.
    """
    live = np.flatnonzero(mask.ravel())
    return None if len(live) == mask.size else live


def _rows(products: np.ndarray, live: np.ndarray | None) -> np.ndarray:
    """[B, T, H] ``products`` as rows, [B*T, H], or the ``live`` ones only (`_unrows` undoes it)."""
    rows = products.reshape(-1, products.shape[-1])
    return rows if live is None else rows[live]


def _unrows(rows: np.ndarray, live: np.ndarray | None, count: int) -> np.ndarray:
    """`_rows`'s ``rows`` [N, H] back in all ``count`` = B*T positions, [B*T, H]; padding's zero."""
    if live is None:
        return rows
    out = np.zeros((count, rows.shape[1]), rows.dtype)
    out[live] = rows
    return out


def _prelu(x: np.ndarray, slope: np.ndarray) -> np.ndarray:
    """PReLU(x) = max(x, slope * x) when every slope is at most 1 (two passes); else by `_prelu_factor`."""
    if (slope > 1).any():
        return x * _prelu_factor(x, slope)
    z = x * slope
    return np.maximum(z, x, out=z)


def _prelu_factor(x: np.ndarray, slope: np.ndarray) -> np.ndarray:
    """PReLU's derivative at ``x``, 1 where x > 0 and the slope elsewhere; PReLU(x) = x * it.

    Built from a mask (np.where with a broadcast slope is ~6x slower), it serves forward and backward.
    """
    factor = (x > 0).astype(np.float32)
    factor *= 1 - slope
    factor += slope
    return factor


def _times(rows: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """``rows @ matrix``; by a broadcast multiply when ``rows`` is one column (3x faster than BLAS)."""
    if rows.shape[1] == 1:
        return rows * matrix[0]
    return rows @ matrix
