"""The ``features`` baseline.

An online logistic regression on the causal match features (`streamrec.learner.match`) and
a bias, as a learner of the same contract.

It knows no ids, only how each sample's own history relates to its target: a DIN that does
not beat it learns nothing that "is the target in the history, or in its categories" does
not say. Each micro-batch it takes a few Newton steps on that micro-batch's log loss plus a
quadratic pull towards the weights so far, weighted by the curvature of every earlier
micro-batch (a Laplace approximation of the whole past: with five weights, exact enough).
No random draws: the same micro-batches give the same weights.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from streamrec.learner.base import TrainResult
from streamrec.learner.columns import SampleColumns, require_columns
from streamrec.learner.match import MATCH_FEATURES, match_features
from streamrec.learner.metrics import logloss

# A ridge of one pseudo-sample per weight: keeps the weights finite when a feature separates
# the labels outright (a sampler's tell) and is nothing beside a micro-batch's thousands.
RIDGE = 1.0
# Newton steps per micro-batch: from the previous weights logistic regression converges in a
# handful; the loop stops earlier once a step moves no weight by more than STEP_TOLERANCE.
NEWTON_STEPS = 8
STEP_TOLERANCE = 1e-8
# The shortest damped step tried before a Newton step is taken as it is.
MIN_STEP_SCALE = 1e-3


def design(batch: SampleColumns) -> np.ndarray:
    """float64 [B, F + 1]: the match features in `MATCH_FEATURES` order, then a bias."""
    columns = list(match_features(batch).values())
    return np.column_stack([*columns, np.ones(len(batch))]) if len(batch) else np.zeros((0, len(columns) + 1))


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return np.asarray(0.5 * (1.0 + np.tanh(0.5 * z)))  # overflow-free


class FeaturesLearner:
    """Online logistic regression on the match features; see the module docstring."""

    def __init__(self, ridge: float = RIDGE, newton_steps: int = NEWTON_STEPS) -> None:
        self.ridge = ridge
        self.newton_steps = newton_steps
        width = len(MATCH_FEATURES) + 1
        self.weights = np.zeros(width)
        self.precision = ridge * np.eye(width)  # the past's curvature, plus the ridge

    def predict_many(self, batch: SampleColumns) -> np.ndarray:
        """See `Learner`."""
        return _sigmoid(design(require_columns(batch)) @ self.weights)

    def learn_many(self, batch: SampleColumns) -> TrainResult:
        """See `Learner`."""
        x, y = design(require_columns(batch)), batch.label.astype(np.float64)
        start, w, steps = self.weights, self.weights.copy(), 0

        def objective(v: np.ndarray) -> float:
            z, d = x @ v, v - start
            return float(np.sum(np.logaddexp(0.0, z) - y * z) + 0.5 * d @ self.precision @ d)

        for steps in range(1, self.newton_steps + 1):  # noqa: B007  # steps counts those taken
            p = _sigmoid(x @ w)
            grad = x.T @ (p - y) + self.precision @ (w - start)
            hess = (x * (p * (1.0 - p))[:, None]).T @ x + self.precision
            step = np.linalg.solve(hess, grad)
            if not np.isfinite(step).all():
                return TrainResult(steps=steps, skipped_steps=1)
            # Damped: halve the step until the objective falls. A full Newton step on a
            # nearly separable micro-batch overshoots into saturation (weights of +-200, every
            # score tied at 0 or 1), which the next micro-batches cannot undo.
            before, scale = objective(w), 1.0
            while scale > MIN_STEP_SCALE and objective(w - scale * step) > before:
                scale *= 0.5
            w = w - scale * step
            if np.abs(scale * step).max() < STEP_TOLERANCE:
                break
        p = _sigmoid(x @ w)
        self.precision = self.precision + (x * (p * (1.0 - p))[:, None]).T @ x
        self.weights = w
        return TrainResult(logloss(y, p), steps=steps)

    def is_known(self, batch: SampleColumns) -> np.ndarray:
        """No target is ever known: the model has no ids."""
        return np.zeros(len(require_columns(batch)), dtype=bool)

    def state_arrays(self) -> dict[str, np.ndarray]:
        """See `Learner`."""
        return {"model/weights": self.weights.copy(), "state/precision": self.precision.copy()}

    def load_state_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        """See `Learner`."""
        self.weights = np.array(arrays["model/weights"], dtype=np.float64)
        self.precision = np.array(arrays["state/precision"], dtype=np.float64)
