"""DIN's layers as the export's ONNX graph computes them: the same functions, ONNX Runtime's fastest forms.

The training forms (`streamrec.learner.model.attention_first_layer`, `prelu_linear`) suit
Paddle, which broadcasts slowly and has no cheap one-column product; ONNX Runtime (MLAS)
prefers other forms of the same functions. Measured on the default DIN, 100 candidates
of 50 behaviours on one core (docs/operating/sizing.md, "Serving"):

- the attention's per-sample weights [B, D + 1, H] by a broadcast multiply-add rather than
  `attention_first_layer`'s block matrix product ([B, D + 1] x [D + 1, (D + 1) H], D + 1
  times the multiply-adds, nearly all of them by zero);
- each MLP's last layer, one unit wide, as a row, w^T x^T, [1, N]: ONNX Runtime fuses the
  transpose into the product, and a [N, C] x [C, 1] product runs 3x slower than its
  transposed twin.

PReLU stays folded into the next Linear (`prelu_linear`): ONNX Runtime's own PRelu kernel on
[5,000 x 64] rows takes 7x the second matrix product it saves, and relu-multiply-add
elementwise 1.5x.

`onnx_forms` switches a model's layers to these forms while the export traces the graph it
converts to ONNX; training, scoring in the learner and the export's Paddle graph keep the
training forms. The export keeps the ONNX graph only when ONNX Runtime scores a probe as
Paddle does the training forms (`streamrec.serving.onnxfile.PARITY`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import paddle
import paddle.nn.functional as F
from paddle import nn


def prelu_slope(prelu: nn.Layer) -> paddle.Tensor:
    """A PReLU layer's slope, [C] per channel: its one parameter, read through the public API."""
    (slope,) = prelu.parameters()
    return slope


def attention_first_layer_broadcast(
    first: nn.Layer, query: paddle.Tensor, keys: paddle.Tensor
) -> paddle.Tensor:
    """`attention_first_layer` with the per-sample weights broadcast: [B, T, H].

    ``query`` [B, D], ``keys`` [B, T, D + 1] (a last column of ones). With the weight's row
    blocks W1..W4 the layer is k (W2 - W3 + diag(q) W4) + (q (W1 + W3) + b): the first
    bracket is W2 - W3 plus q's column times W4 ([B, D, H], broadcast), the second one [D, H]
    product, and the keys see one batched product with both stacked.
    """
    d = query.shape[-1]
    w = first.weight
    query_term = paddle.matmul(query, w[:d] + w[2 * d : 3 * d]) + first.bias
    keys_term = (w[d : 2 * d] - w[2 * d : 3 * d]).unsqueeze(0) + query.unsqueeze(-1) * w[3 * d :].unsqueeze(0)
    return paddle.bmm(keys, paddle.concat([keys_term, query_term.unsqueeze(1)], axis=1))


def prelu_linear_row(x: paddle.Tensor, prelu: nn.Layer, linear: nn.Layer) -> paddle.Tensor:
    """``linear(prelu(x)).squeeze(-1)`` for a one-unit ``linear`` on [N, C] rows: [N].

    `prelu_linear`'s two products taken as rows, w^T relu(x)^T and w^T x^T ([1, C] x [C, N]).
    """
    slope = prelu_slope(prelu).unsqueeze(-1)
    w = linear.weight
    row = paddle.matmul((1.0 - slope) * w, F.relu(x), transpose_x=True, transpose_y=True)
    row = row + paddle.matmul(slope * w, x, transpose_x=True, transpose_y=True)
    return (row + linear.bias).reshape([-1])


def onnx_form_layers(model: nn.Layer) -> list[nn.Layer]:
    """``model``'s layers that have an ONNX form (an ``onnx_form`` flag), in their training form."""
    layers = model.sublayers(include_self=True)
    return [layer for layer in layers if getattr(layer, "onnx_form", None) is False]


@contextmanager
def onnx_forms(model: nn.Layer) -> Iterator[None]:
    """``model``'s layers that have an ONNX form in it for the block.

    The flags are plain attributes read when the graph is traced; they are set back on leaving.
    """
    layers = onnx_form_layers(model)
    for layer in layers:
        layer.onnx_form = True
    try:
        yield
    finally:
        for layer in layers:
            layer.onnx_form = False
