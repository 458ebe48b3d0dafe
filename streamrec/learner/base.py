"""The learner contract: what the learner loop, the replay tool and every model agree on.

As river's ``MiniBatchClassifier``: constructor arguments are the hyper-parameters, and the
loop depends on these few methods only, so another model (a baseline, a new architecture)
plugs in by implementing them. Micro-batches arrive as :class:`~streamrec.learner.batch.Batch`
columns; a model encodes them as it needs (hashing, id tables).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np

from streamrec.learner.batch import Batch


class Learner(Protocol):
    """An incremental binary classifier trained on micro-batches.

    State keys are ``<group>/<name>``: the group names the snapshot file the array goes to
    (``model`` for what serving needs; ``optimizer`` and ``state`` for resuming training).
    """

    def predict_many(self, batch: Batch) -> np.ndarray:
        """Positive-class probabilities, float64 [B]; changes nothing."""
        ...

    def learn_many(self, batch: Batch) -> float:
        """Train on the labelled batch; returns the mean training loss (NaN when empty)."""
        ...

    def is_known(self, batch: Batch) -> np.ndarray:
        """Bool [B]: whether the model has learnt from each target item before."""
        ...

    def state_arrays(self) -> dict[str, np.ndarray]:
        """Everything needed to resume training exactly, as named numpy arrays."""
        ...

    def load_state_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Restore what :meth:`state_arrays` returned, from this or another process."""
        ...
