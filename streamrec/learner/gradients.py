"""The learner ranks' gradients, averaged after each backward pass in one exchange a step.

``paddle.DataParallel`` all-reduced the dense gradients and all-gathered each embedding's sparse
row gradient on its own: on this model four tables, each a count, its rows and its values,
and on gloo a collective costs a rank a fixed 0.3 ms of CPU or more in its threads, however
small (up to about a millisecond before `streamrec.learner.ranks.batch_scheduled`).
`GradientSum` sends all of a step's gradients at once: one
all-gather (`RankGroup.gather`) of this rank's dense gradients and its tables' rows and
values, packed as one int64 array; each rank then sums the dense ones and concatenates the row
gradients in rank order, both divided by the ranks (as ``DataParallel``'s average: a rank's
loss is scaled by its share, `GroupLayout.share`), and the optimizer applies them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate, pairwise
from typing import Any

import numpy as np
import paddle
import paddle.nn.functional as F  # noqa: N812 - Paddle's own spelling

#: ``RankGroup.gather``: every rank's int64 1-D array, in rank order.
Gather = Callable[[np.ndarray, str], list[np.ndarray]]


@dataclass(frozen=True)
class Gradients:
    """One rank's gradients as arrays, in the module's parameter order.

    Attributes:
        dense: float32, each a parameter's shape; None where the parameter has no gradient.
        rows: int64 [n]: each sparse parameter's rows (repeats allowed: they add up).
        values: float32 [n, width]: those rows' gradients.
    """

    dense: list[np.ndarray | None]
    rows: list[np.ndarray]
    values: list[np.ndarray]

    def pack(self) -> np.ndarray:
        """One int64 array: which dense gradients are present, the row counts, rows, then the floats."""
        floats = [g.ravel() for g in self.dense if g is not None] + [v.ravel() for v in self.values]
        head = len(self.dense) + len(self.rows)
        row_ends = list(accumulate((len(r) for r in self.rows), initial=head))
        n_floats = sum(len(f) for f in floats)
        # One array, each part copied once into its place; the floats padded to whole int64 items.
        packed = np.zeros(row_ends[-1] + (n_floats + 1) // 2, np.int64)
        packed[: len(self.dense)] = [g is not None for g in self.dense]
        packed[len(self.dense) : head] = [len(r) for r in self.rows]
        for (a, b), r in zip(pairwise(row_ends), self.rows, strict=True):
            packed[a:b] = r
        tail = packed[row_ends[-1] :].view(np.float32)
        for (a, b), f in zip(pairwise(accumulate(map(len, floats), initial=0)), floats, strict=True):
            tail[a:b] = f
        return packed

    @classmethod
    def unpack(
        cls, packed: np.ndarray, shapes: Sequence[tuple[int, ...]], widths: Sequence[int]
    ) -> Gradients:
        """What `pack` made of gradients of dense ``shapes`` and sparse row ``widths``.

        Raises:
            ValueError: ``packed`` is not of these parameters (another model, or cut short).
        """
        head = len(shapes) + len(widths)
        if len(packed) < head:
            raise ValueError(f"a rank's gradients hold {len(packed)} items, fewer than their header's {head}")
        present = packed[: len(shapes)].tolist()
        counts = packed[len(shapes) : head].tolist()
        row_ends = list(accumulate(counts, initial=head))
        rows = [packed[a:b] for a, b in pairwise(row_ends)]
        floats = packed[row_ends[-1] :].view(np.float32)
        # math.prod and slices: np.prod and np.split cost ~0.3 ms a rank a step here.
        sizes = [math.prod(s) if p else 0 for s, p in zip(shapes, present, strict=True)]
        sizes += [n * w for n, w in zip(counts, widths, strict=True)]
        if len(floats) != sum(sizes) + sum(sizes) % 2:  # `pack` pads to whole int64 items
            raise ValueError(
                f"a rank's gradients hold {len(floats)} numbers, not the {sum(sizes)} of this model"
            )
        parts = [floats[a:b] for a, b in pairwise(accumulate(sizes, initial=0))]
        dense = [p.reshape(s) if on else None for p, s, on in zip(parts, shapes, present, strict=False)]
        values = [p.reshape(-1, w) for p, w in zip(parts[len(shapes) :], widths, strict=True)]
        return cls(dense, rows, values)

    @classmethod
    def mean(cls, ranks: Sequence[Gradients], into: Sequence[np.ndarray | None] = ()) -> Gradients:
        """The ranks' average: dense gradients summed, row gradients concatenated in rank order.

        Both divided by the number of ranks. A dense average is written into ``into``'s array
        at its place where it has one (the live gradient, `GradientSum.mine`): no copy to set.
        """
        scale = np.float32(1 / len(ranks))
        dense: list[np.ndarray | None] = []
        for i, grads in enumerate(zip(*(r.dense for r in ranks), strict=True)):
            held = [g for g in grads if g is not None]
            if not held:
                dense.append(None)
                continue
            given = into[i] if i < len(into) else None
            total: np.ndarray = np.empty_like(held[0]) if given is None else given
            np.copyto(total, held[0])
            for g in held[1:]:
                total += g
            total *= scale
            dense.append(total)
        rows = [np.concatenate(rs) for rs in zip(*(r.rows for r in ranks), strict=True)]
        values = [np.concatenate(vs) for vs in zip(*(r.values for r in ranks), strict=True)]
        for v in values:
            v *= scale
        return cls(dense, rows, values)


class GradientSum:
    """After a backward pass, every rank's gradients of ``module`` averaged into each rank's.

    The sparse parameters are those of ``module``'s embeddings with sparse (row) gradients;
    the rest are dense. Every rank must hold the same module.
    """

    def __init__(self, module: paddle.nn.Layer, gather: Gather) -> None:
        """Sort ``module``'s trainable parameters into dense and sparse."""
        sparse = {
            id(layer.weight)
            for layer in module.sublayers()
            if isinstance(layer, paddle.nn.Embedding) and layer._sparse  # noqa: SLF001 - no public getter
        }
        trainable = [p for p in module.parameters() if not p.stop_gradient]
        self._dense = [p for p in trainable if id(p) not in sparse]
        self._sparse = [p for p in trainable if id(p) in sparse]
        self._shapes = [tuple(p.shape) for p in self._dense]
        self._widths = [int(np.prod(p.shape[1:])) for p in self._sparse]
        self._gather = gather

    def __call__(self) -> None:
        """Exchange this rank's gradients and set the group's average in their place."""
        mine = self.mine()
        gathered = self._gather(mine.pack(), "gradients")
        ranks = [Gradients.unpack(g, self._shapes, self._widths) for g in gathered]
        self.set(Gradients.mean(ranks, into=mine.dense))  # the dense averages land in place

    def mine(self) -> Gradients:
        """This rank's gradients, as the backward pass left them.

        A dense gradient on the CPU is a view of the live gradient (writing it writes the
        gradient); elsewhere a copy.
        """
        rows, values = [], []
        for p, width in zip(self._sparse, self._widths, strict=True):
            if p.grad is None:
                rows.append(np.zeros(0, np.int64))
                values.append(np.zeros((0, width), np.float32))
                continue
            # Private API: Paddle has no public accessor for a SelectedRows gradient's values.
            rows.append(np.asarray(p.grad.rows(), np.int64))
            values.append(p.grad._get_tensor_from_selected_rows().numpy().reshape(-1, width))  # noqa: SLF001
        if any(p.grad is not None and p.grad.is_selected_rows() for p in self._dense):
            raise TypeError(
                "a parameter outside the module's nn.Embedding layers has a sparse (row) gradient: "
                "the ranks cannot average it; look it up through an nn.Embedding(sparse=True)"
            )
        dense = [None if p.grad is None else _live(p.grad) for p in self._dense]
        return Gradients(dense, rows, values)

    def set(self, grads: Gradients) -> None:
        """Make ``grads`` the parameters' gradients (what the optimizer steps by)."""
        for p, g in zip(self._dense, grads.dense, strict=True):
            if g is None:
                continue
            if p.grad is None:
                (p * paddle.to_tensor(g)).sum().backward()  # d/dp sum(p * g) = g exactly
            elif g.ctypes.data != p.grad.data_ptr():  # not already the live gradient (`mine`)
                p.grad.set_value(g)
        looked, values_in = [], []
        for p, rows, values in zip(self._sparse, grads.rows, grads.values, strict=True):
            if len(rows) and overwrite_rows(p, rows, values):
                continue
            p.clear_gradient(False)
            if len(rows):
                # No row gradient here to overwrite: the backward pass of a sparse lookup of
                # E[rows], given ``values`` as the lookup's gradient, makes exactly (rows, values).
                looked.append(F.embedding(paddle.to_tensor(rows), p, sparse=True).reshape(values.shape))
                values_in.append(paddle.to_tensor(values))
        if looked:
            paddle.autograd.backward(looked, values_in)


def overwrite_rows(param: paddle.Tensor, rows: np.ndarray, values: np.ndarray) -> bool:
    """Make ``param``'s row gradient (rows, values) in place; False where it has none to overwrite.

    The backward pass left a row gradient (a SelectedRows) on the CPU: its rows and values are
    set where they lie, and the optimizer reads them as it would the backward pass's own. It
    spares `GradientSum.set` its surrogate backward pass, which took 0.23 of the 0.35 ms that
    setting a step's gradients took (measured in one process, MovieLens; 0.15 ms now).
    Private API: Paddle has no public setter of a row gradient; `set` falls back to the
    surrogate elsewhere (no gradient yet, or not on the CPU: untested there).
    """
    grad = param.grad
    if grad is None or not grad.is_selected_rows() or not param.place.is_cpu_place():
        return False
    # Paddle's stubs say it returns nothing; it returns the gradient's SelectedRows.
    held: Any = grad.get_selected_rows()  # type: ignore[func-returns-value]
    held.set_rows(rows.tolist())  # a list converts in half the time of an array (pybind11)
    held.get_tensor().set(np.ascontiguousarray(values), paddle.CPUPlace())
    return True


def _live(grad: paddle.Tensor) -> np.ndarray:
    """A dense gradient as an array: on the CPU a view of it (DLPack), elsewhere a copy."""
    if grad.place.is_cpu_place():
        return np.from_dlpack(grad.detach())
    return grad.numpy()
