"""A table learner's training passes: seeded shuffles into mini-batches, one optimizer step each.

`MiniBatchSteps` is the part of `streamrec.learner.trainer.TableLearner` that turns an encoded
batch into optimizer steps: ``cfg.passes`` seeded shuffles cut into mini-batches of
``train_batch_size`` (times the ranks, each training its share, `streamrec.learner.ranks`);
each a step of the data loss with lazy Adam, online EWC's penalty on the rows it looked up,
and nothing changed when the loss or a gradient is not finite. EWC consolidates a
micro-batch's steps at its close (`end_micro_batch`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

import numpy as np
import paddle

from streamrec.config import ModelConfig
from streamrec.learner.base import TrainResult
from streamrec.learner.columns import ColumnKeys, EncodedColumns, SampleColumns, column_keys
from streamrec.learner.ewc import OnlineEWC
from streamrec.learner.features import FeaturePlan, model_columns
from streamrec.learner.numpy_attention import one_blas_thread
from streamrec.learner.ranks import GroupLayout, RankShare, padding_only
from streamrec.learner.state import EMBEDDING, WIDE, all_finite, unique_rows
from streamrec.samples import Sample


class MiniBatchSteps:
    """The training steps of a `TableLearner` (which sets every attribute below)."""

    #: Whether the model reads the per-id biases of the behaviours too (not only the target's):
    #: EWC then regularises the rows a mini-batch read along its sequences.
    WIDE_ALONG_SEQUENCE: ClassVar[bool] = False

    cfg: ModelConfig
    plan: FeaturePlan
    model: paddle.nn.Layer
    train_module: paddle.nn.Layer
    _optimizer: paddle.optimizer.Optimizer
    _params: list[paddle.Tensor]
    _named: dict[str, paddle.Tensor]
    _ewc: OnlineEWC | None
    _ranks: RankShare | None
    _sum_gradients: Callable[[], None] | None
    _shuffle_seed: int
    _learn_calls: int
    _taken: int

    def _encode(self, batch: SampleColumns, keys: ColumnKeys) -> EncodedColumns:
        """The batch's ids as this model's table rows (the learner's)."""
        raise NotImplementedError

    def end_micro_batch(self) -> None:
        """Close the micro-batch that `learn_part` trained: EWC consolidates all its steps."""
        if self._ewc is not None:
            self._ewc.consolidate(self._taken)
        self._taken = 0

    def learn_encoded(
        self, encoded: EncodedColumns, layout: GroupLayout | None = None, close: bool = True
    ) -> TrainResult:
        """The training passes of `learn_many` (`learn_share`) on an already encoded batch.

        ``close=False``: a part of a micro-batch, closed later by `end_micro_batch`.
        """
        layout = GroupLayout.alone(len(encoded)) if layout is None else layout
        if layout.total == 0:
            if close:
                self.end_micro_batch()
            return TrainResult()
        self.train_module.train()
        # Seeded by (seed, call count), both in state_arrays, so a restored learner shuffles
        # the next batch exactly as the original would have.
        rng = np.random.default_rng([self._shuffle_seed, self._learn_calls])
        world = 1 if self._ranks is None else self._ranks.world
        size = self.cfg.train_batch_size * world
        total = paddle.zeros([], dtype="float32")
        penalties = paddle.zeros([], dtype="float32")
        trained = steps = skipped = 0
        with one_blas_thread():  # once here, not in every step's forward and backward
            for _ in range(self.cfg.passes):
                order = rng.permutation(layout.total)
                for start in range(0, layout.total, size):
                    mine, scale = layout.share(order[start : start + size], world)
                    part = encoded.take(mine) if len(mine) else self._padding(encoded)
                    losses = self._step(part, scale)
                    steps += 1
                    if losses is None:
                        skipped += 1
                        continue
                    total += losses[0] * len(mine)
                    penalties += losses[1] * len(mine)
                    trained += len(mine)
        self._learn_calls += 1
        self._taken += steps - skipped
        if close:
            self.end_micro_batch()
        if not trained:
            return TrainResult(math.nan, steps, skipped)
        loss, penalty = float(total) / trained, float(penalties) / trained
        return TrainResult(loss, steps, skipped, penalty, samples=trained)

    def _padding(self, encoded: EncodedColumns) -> EncodedColumns:
        """One sample that reads only padding, shaped as this model's inputs."""
        if len(encoded):
            return padding_only(encoded.take([0]))
        pad = SampleColumns.from_samples([Sample("", "", 0, "", "", 0, (), ())])
        return padding_only(self._encode(pad, column_keys(pad, self.cfg)))

    def _step(self, part: EncodedColumns, scale: float = 1.0) -> tuple[paddle.Tensor, paddle.Tensor] | None:
        """One optimizer step on (this rank's share of) a mini-batch, its loss scaled by ``scale``.

        Its data loss and EWC penalty, or None, with the weights and the optimizer's state
        untouched, when the loss or a gradient is not finite.

        The penalty's gradient is added after the data loss's gradients went into the Fisher
        estimate: EWC measures what the data says, not its own pull.
        """
        loss = self.train_module(*self._inputs(part), paddle.to_tensor(part.label))
        (loss if scale == 1.0 else loss * scale).backward()
        if self._sum_gradients is not None:
            self._sum_gradients()  # the group's average: every rank steps alike
        penalty = None
        finite = all_finite([loss, *(p.grad for p in self._params if p.grad is not None)])
        if finite and self._ewc is not None:
            self._ewc.accumulate()
            penalty = self._ewc.penalty(self._looked_up(part))
            if penalty is not None:
                penalty.backward()
        if finite:
            self._optimizer.step()
        self._optimizer.clear_grad()
        if not finite:
            return None
        return loss.detach(), (paddle.zeros([]) if penalty is None else penalty.detach())

    def _looked_up(self, part: EncodedColumns) -> dict[str, paddle.Tensor]:
        """The rows each sparse parameter looks up in a mini-batch.

        The rows of each sparse parameter a mini-batch looks up (padding left out), by
        structured parameter name.
        """
        looked: dict[str, list[np.ndarray]] = {}
        wide: dict[str, list[np.ndarray]] = {}
        for (f, side), column in zip(self.plan.inputs, model_columns(part, self.plan), strict=True):
            if f.table is None:
                continue
            looked.setdefault(f.table, []).append(column.ravel())
            # DIN's wide part reads the targets' biases only; DeepFM's every side's.
            if side == "target" or self.WIDE_ALONG_SEQUENCE:
                wide.setdefault(f.table, []).append(column.ravel())
        none = [np.zeros(0, np.int64)]
        rows: dict[str, paddle.Tensor] = {}
        for table in self.plan.tables:
            rows[EMBEDDING.format(table)] = unique_rows(np.concatenate(looked.get(table, none)))
            if WIDE.format(table) in self._named:
                rows[WIDE.format(table)] = unique_rows(np.concatenate(wide.get(table, none)))
        return rows

    def _inputs(self, encoded: EncodedColumns) -> tuple[list[paddle.Tensor], paddle.Tensor]:
        """The model's input tensors for an encoded batch, on the learner's device.

        Every feature's input in `FeaturePlan` order, and the dense features.
        """
        return (
            [paddle.to_tensor(a) for a in model_columns(encoded, self.plan)],
            paddle.to_tensor(encoded.dense),
        )
