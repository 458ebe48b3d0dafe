"""The learner contract: what the learner loop, the replay tool and every model agree on.

As river's ``MiniBatchClassifier``: constructor arguments are the hyper-parameters, and the
loop depends on these few methods only, so another model (a baseline, a new architecture)
plugs in by implementing them. Micro-batches arrive as `SampleColumns`
columns; a model encodes them as it needs (hashing, id tables).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from streamrec.learner.columns import SampleColumns


@dataclass(frozen=True, slots=True)
class TrainResult:
    """What one `Learner.learn_many` call did.

    A step whose loss or gradients were not finite (NaN or infinite) is skipped, leaving the
    weights as they were: one poisoned step would otherwise spread NaN through every weight.
    The loop counts a micro-batch with a skipped step as bad, and stops after several in a row.

    Attributes:
        loss: Mean training loss over the samples of the steps taken; NaN when none was.
        steps: Optimizer steps attempted (taken and skipped).
        skipped_steps: Steps skipped for a non-finite loss or gradient.
        penalty: Mean regularisation penalty (online EWC) over the same samples; ``loss``
            excludes it.
        ids_admitted: Per dynamic table, ids given a row of their own before training.
        ids_evicted: Per dynamic table, ids whose row was taken back (unseen too long).
        ids_refused: Per dynamic table, ids due a row that found none (the table full).
        rows_in_use: Per dynamic table, rows owned by ids afterwards.
        samples: Samples of the steps taken (each pass counts them again): what ``loss`` and
            ``penalty`` are means over, so that several ranks' combine (0 where unknown).
    """

    loss: float = math.nan
    steps: int = 0
    skipped_steps: int = 0
    penalty: float = 0.0
    ids_admitted: Mapping[str, int] = field(default_factory=dict)
    ids_evicted: Mapping[str, int] = field(default_factory=dict)
    ids_refused: Mapping[str, int] = field(default_factory=dict)
    rows_in_use: Mapping[str, int] = field(default_factory=dict)
    samples: int = 0

    @property
    def penalty_share(self) -> float:
        """The penalty's share of the total training loss, 0..1 (NaN when nothing trained)."""
        total = self.loss + self.penalty
        return self.penalty / total if total > 0 else math.nan

    @property
    def bad(self) -> bool:
        """Whether any step was skipped."""
        return self.skipped_steps > 0


class Learner(Protocol):
    """An incremental binary classifier trained on micro-batches.

    State keys are ``<group>/<name>``: the group names the snapshot file the array goes to
    (``model`` for what serving needs; ``optimizer`` and ``state`` for resuming training).
    """

    def predict_many(self, batch: SampleColumns) -> np.ndarray:
        """Positive-class probabilities, float64 [B]; changes nothing."""
        ...

    def learn_many(self, batch: SampleColumns) -> TrainResult:
        """Train on the labelled batch, skipping any step that is not finite."""
        ...

    def is_known(self, batch: SampleColumns) -> np.ndarray:
        """Bool [B]: whether the model has learnt from each target item before."""
        ...

    def state_arrays(self) -> dict[str, np.ndarray]:
        """Everything needed to resume training exactly, as named numpy arrays."""
        ...

    def load_state_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Restore what `state_arrays` returned, from this or another process."""
        ...


@runtime_checkable
class PartLearner(Protocol):
    """A `Learner` that can train a micro-batch in parts while it is gathered.

    ``learn_part`` for each part (scored before it, as a micro-batch is), then
    ``end_micro_batch`` once at its close: what a learner does once per micro-batch (online
    EWC's consolidation) waits for it and covers every part, so one part followed by the
    close is ``learn_many``. The loop trains a learner without these methods part by part
    with ``learn_many``.
    """

    def learn_part(self, batch: SampleColumns) -> TrainResult:
        """Train on a labelled part of the micro-batch being gathered."""
        ...

    def end_micro_batch(self) -> None:
        """Close the micro-batch whose parts `learn_part` trained."""
        ...
