"""A learner of the tests' own, loaded by class path (``STREAMREC_MODEL__LEARNER``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import orjson

from streamrec.config import ModelConfig
from streamrec.learner.base import TrainResult
from streamrec.learner.columns import SampleColumns

CLASS_PATH = "tests.unit.learner.tiny_learner:TinyLearner"


class TinyLearner:
    """Scores every sample with the positive rate of the samples learnt so far."""

    def __init__(self, prior: float = 0.5) -> None:
        self.prior = prior
        self.counts = np.zeros(2)  # positives, samples

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> TinyLearner:
        """Built from the model section: one hyper-parameter taken from it."""
        return cls(prior=min(1.0, cfg.learning_rate * 500))

    def predict_many(self, batch: SampleColumns) -> np.ndarray:
        rate = (self.counts[0] + self.prior) / (self.counts[1] + 1.0)
        return np.full(len(batch), rate, dtype=np.float64)

    def learn_many(self, batch: SampleColumns) -> TrainResult:
        self.counts += [float(batch.label.sum()), len(batch)]
        return TrainResult(loss=0.0, steps=1)

    def is_known(self, batch: SampleColumns) -> np.ndarray:
        return np.zeros(len(batch), dtype=bool)

    def state_arrays(self) -> dict[str, np.ndarray]:
        return {"model/counts": self.counts.copy()}

    def load_state_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.counts = np.array(arrays["model/counts"], dtype=np.float64)


class NotALearner:
    """Has some of the contract, not all of it."""

    def predict_many(self, batch: SampleColumns) -> np.ndarray:
        return np.zeros(len(batch))


class NeedsArguments:
    """The contract's methods, but a constructor that needs an argument and no from_config."""

    def __init__(self, prior: float) -> None:
        self.learner = TinyLearner(prior)

    predict_many = TinyLearner.predict_many
    learn_many = TinyLearner.learn_many
    is_known = TinyLearner.is_known
    state_arrays = TinyLearner.state_arrays
    load_state_arrays = TinyLearner.load_state_arrays


class SettingsBlindLearner:
    """The contract's methods, built with no arguments and no from_config: it reads no model settings."""

    def __init__(self) -> None:
        self.prior, self.counts = 0.5, np.zeros(2)

    predict_many = TinyLearner.predict_many
    learn_many = TinyLearner.learn_many
    is_known = TinyLearner.is_known
    state_arrays = TinyLearner.state_arrays
    load_state_arrays = TinyLearner.load_state_arrays


class ExportableTinyLearner(TinyLearner):
    """A `TinyLearner` that exports itself: its rate and a contract saying how to read it."""

    def export_for_serving(self, directory: Path, version: int) -> None:
        rate = (self.counts[0] + self.prior) / (self.counts[1] + 1.0)
        np.save(directory / "rate.npy", np.array([rate]), allow_pickle=False)
        contract = {"version": version, "output": "every candidate scores rate.npy[0]"}
        (directory / "contract.json").write_bytes(orjson.dumps(contract))


class ContractlessLearner(TinyLearner):
    """Exports a model but states no scoring contract."""

    def export_for_serving(self, directory: Path, version: int) -> None:
        (directory / "rate.txt").write_text("0.5")


class OwnInputsLearner(TinyLearner):
    """Exports itself with a contract of its own that, as DIN's, lists ``inputs`` (of its own kind)."""

    def export_for_serving(self, directory: Path, version: int) -> None:
        rate = (self.counts[0] + self.prior) / (self.counts[1] + 1.0)
        np.save(directory / "rate.npy", np.array([rate]), allow_pickle=False)
        contract = {"version": version, "inputs": [{"name": "user_id", "dtype": "string"}], "output": "rate"}
        (directory / "contract.json").write_bytes(orjson.dumps(contract))


EXPORTABLE_PATH = "tests.unit.learner.tiny_learner:ExportableTinyLearner"
CONTRACTLESS_PATH = "tests.unit.learner.tiny_learner:ContractlessLearner"
OWN_INPUTS_PATH = "tests.unit.learner.tiny_learner:OwnInputsLearner"
