"""Online EWC, elastic weight consolidation against forgetting (Schwarz et al. 2018).

After each micro-batch the learner keeps a diagonal Fisher estimate ``F <- gamma * F +
F_batch`` and an anchor ``theta* =`` the weights after it; every step of the next micro-batch
adds ``(lambda / 2) * sum F * (theta - theta*)^2`` to the loss, pulling the weights that
mattered for earlier data back towards where they were.

- ``F_batch`` is the mean over the micro-batch's steps of the squared gradients of the data
  loss, read from the gradients the steps compute anyway: no extra pass. (A squared
  mini-batch-mean gradient, not the mean of per-sample squares: smaller by about the
  mini-batch size and noisier, the usual price of a free estimate.) Optionally it is
  normalised to a mean of 1 over the entries it touched, so that ``lambda`` does not depend
  on the loss's scale or the mini-batch size.
- Embedding tables are sparse: a step's gradient, and so its Fisher mass, covers only the
  rows it looked up, and the penalty is taken over those rows only (a gather of F, theta*
  and theta): its cost grows with the rows a batch touches, not with the table. Rows a step
  does not touch get no gradient from the penalty anyway, so this is exact for training;
  the *value* reported is the penalty over the touched rows.
- Once per micro-batch: the decay is one whole-table multiply; the new Fisher mass, the
  anchor and the normalisation touch only the rows the micro-batch updated (lazy Adam
  changes no other row).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import paddle
import paddle.nn.functional as F

FISHER = "fisher/"
ANCHOR = "anchor/"


class OnlineEWC:
    """Fisher estimates and anchors for a set of parameters, and the penalty they define."""

    def __init__(
        self,
        params: Mapping[str, paddle.Tensor],
        sparse: frozenset[str],
        lam: float,
        gamma: float,
        normalise: bool,
    ) -> None:
        """Track ``params`` (structured name -> parameter).

        Args:
            params: Every trainable parameter, by structured name.
            sparse: The names of the sparse (embedding) parameters, whose rows a
                mini-batch looks up.
            lam: The penalty's strength, lambda.
            gamma: How much of the Fisher estimate carries over to the next micro-batch.
            normalise: Scale each micro-batch's Fisher to a mean of 1 over what it touched.
        """
        self.params = dict(params)
        self.sparse = sparse
        self.lam, self.gamma, self.normalise = lam, gamma, normalise
        self.fisher = {n: paddle.zeros(p.shape, p.dtype) for n, p in self.params.items()}
        self.anchor = {n: p.detach().clone() for n, p in self.params.items()}
        # This micro-batch's summed squared gradients, and which rows of each sparse
        # parameter they reached.
        self._batch = {n: paddle.zeros(p.shape, p.dtype) for n, p in self.params.items()}
        self._touched = {n: np.zeros(self.params[n].shape[0], dtype=bool) for n in sparse}
        self._consolidated = False  # no anchor before the first micro-batch: no penalty

    @paddle.no_grad()
    def accumulate(self) -> None:
        """Add the current gradients to this micro-batch's Fisher.

        Add the squared gradients now on the parameters (a step's data loss) to this
        micro-batch's Fisher.
        """
        for name, param in self.params.items():
            grad = param.grad
            if grad is None:
                continue
            if grad.is_selected_rows():
                # A row looked up k times comes as k rows of values: the row's gradient is
                # their sum, to be squared once summed. (Private API: Paddle has no public
                # accessor for a sparse gradient's values.)
                values = grad._get_tensor_from_selected_rows()
                rows, inverse = np.unique(np.asarray(grad.rows(), dtype=np.int64), return_inverse=True)
                summed = paddle.zeros([len(rows), *values.shape[1:]], values.dtype)
                paddle.index_add_(summed, paddle.to_tensor(inverse), 0, values)
                paddle.index_add_(self._batch[name], paddle.to_tensor(rows), 0, summed.square())
                self._touched[name][rows] = True
            else:
                self._batch[name].add_(grad.square())

    def penalty(self, rows: Mapping[str, paddle.Tensor]) -> paddle.Tensor | None:
        """``(lambda / 2) * sum F * (theta - theta*)^2``.

        For a sparse parameter over the rows in ``rows`` (parameter name -> unique row ids, the
        rows the step looks up). None before the first anchor, or with lambda 0.
        """
        if not self._consolidated or self.lam == 0:
            return None
        terms = []
        for name, param in self.params.items():
            if name not in self.sparse:
                terms.append((self.fisher[name] * (param - self.anchor[name]).square()).sum())
                continue
            ids = rows[name]
            if ids.shape[0] == 0:
                continue
            looked_up = F.embedding(ids, param, sparse=True)  # sparse gradient, like the model's
            drift = looked_up - paddle.index_select(self.anchor[name], ids)
            terms.append((paddle.index_select(self.fisher[name], ids) * drift.square()).sum())
        return 0.5 * self.lam * paddle.add_n(terms) if terms else None

    @paddle.no_grad()
    def consolidate(self, steps: int) -> None:
        """End of a micro-batch: ``F <- gamma * F + F_batch / steps``, ``theta* <- theta``."""
        if steps == 0:
            return
        updated = {n: self._updated_rows(n) for n in self.params}
        fresh = {
            n: self._batch[n] if rows is None else paddle.index_select(self._batch[n], rows)
            for n, rows in updated.items()
        }
        scale = 1.0 / steps
        if self.normalise:
            total = sum(float(f.sum()) for f in fresh.values())
            count = sum(int(paddle.count_nonzero(f)) for f in fresh.values())
            scale = count / total if total > 0 else 0.0
        for name, param in self.params.items():
            rows = updated[name]
            self.fisher[name].scale_(self.gamma)
            if rows is None:
                self.fisher[name].add_(scale * fresh[name])
                self._batch[name].zero_()
                self.anchor[name] = param.detach().clone()
            elif rows.shape[0]:
                paddle.index_add_(self.fisher[name], rows, 0, scale * fresh[name])
                paddle.scatter_(self._batch[name], rows, paddle.zeros_like(fresh[name]))
                paddle.scatter_(self.anchor[name], rows, paddle.index_select(param, rows))
        self._consolidated = True

    def _updated_rows(self, name: str) -> paddle.Tensor | None:
        """The rows of a sparse parameter this micro-batch reached (and clears the record).

        None for a dense parameter, which every step updates whole.
        """
        if name not in self.sparse:
            return None
        rows = np.flatnonzero(self._touched[name])
        self._touched[name][:] = False
        return paddle.to_tensor(rows.astype(np.int64))

    @paddle.no_grad()
    def reset_rows(self, name: str, rows: np.ndarray) -> None:
        """Forget rows of a sparse parameter given to other ids.

        No Fisher mass, and the anchor at the row's new value.
        """
        index = paddle.to_tensor(rows.astype(np.int64))
        zeros = paddle.zeros([len(rows), *self.fisher[name].shape[1:]], self.fisher[name].dtype)
        paddle.scatter_(self.fisher[name], index, zeros)
        paddle.scatter_(self._batch[name], index, zeros)
        paddle.scatter_(self.anchor[name], index, paddle.index_select(self.params[name], index))

    @paddle.no_grad()
    def carry(self, other: OnlineEWC) -> None:
        """Take over ``other``'s micro-batch in progress, its tables grown to these rows.

        Its summed squared gradients and the rows they reached: a table grown between the
        parts of a micro-batch (`TableLearner.learn_part`) rebuilds the EWC state, and the
        close must still consolidate the parts trained before it. Rows beyond ``other``'s
        start empty.
        """
        for name, summed in other._batch.items():
            grown = np.zeros(self._batch[name].shape, dtype=summed.numpy().dtype)
            grown[: summed.shape[0]] = summed.numpy()
            self._batch[name] = paddle.to_tensor(grown)
        for name, touched in other._touched.items():
            self._touched[name][: len(touched)] = touched

    def state_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        """Fisher estimates and anchors, as named arrays.

        Fisher estimates and anchors, keyed ``<prefix>fisher/<param>`` and ``anchor/``,
        and whether an anchor exists yet.

        Taken between micro-batches: the micro-batch in progress is not part of it.
        """
        out = {f"{prefix}{FISHER}{n}": t.numpy() for n, t in self.fisher.items()}
        out.update({f"{prefix}{ANCHOR}{n}": t.numpy() for n, t in self.anchor.items()})
        out[f"{prefix}consolidated"] = np.array([int(self._consolidated)], dtype=np.int64)
        return out

    def load_state_arrays(self, arrays: Mapping[str, np.ndarray], prefix: str) -> None:
        """Restore what `state_arrays` returned (shapes checked by the caller)."""
        for name in self.params:
            self.fisher[name] = paddle.to_tensor(arrays[f"{prefix}{FISHER}{name}"])
            self.anchor[name] = paddle.to_tensor(arrays[f"{prefix}{ANCHOR}{name}"])
            self._batch[name].zero_()
        for touched in self._touched.values():
            touched[:] = False
        self._consolidated = bool(arrays[f"{prefix}consolidated"][0])
