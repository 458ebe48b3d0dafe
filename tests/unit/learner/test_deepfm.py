"""DeepFM, the second built-in learner: its parts, its loop, its snapshots and its export.

The contract suite (test_contract.py) runs every check on it, the export's scores included;
these are what is particular to it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import paddle
import pytest

from streamrec.config import ModelConfig, StreamrecConfig
from streamrec.errors import ConfigError
from streamrec.learner import runner as runner_module
from streamrec.learner.columns import SampleColumns
from streamrec.learner.deepfm import FMInteraction
from streamrec.learner.deepfm_learner import DeepFMLearner
from streamrec.learner.registry import make_learner
from streamrec.learner.runner import LearnerRunner
from streamrec.samples import Sample
from streamrec.snapshots.store import SnapshotStore
from tests.support import small_tables
from tests.unit.learner.test_runner_guards import FakeProducer, ScriptedConsumer, config, valid, writer

SMALL = {"tables": small_tables(256, 64, dim=4), "sequence_length": 6, "mlp_units": (8,), "device": "cpu"}


def deepfm_config(tmp_path: Path, learner: str = "deepfm") -> StreamrecConfig:
    cfg = config(tmp_path, 3)
    return cfg.model_copy(update={"model": ModelConfig.model_validate({**SMALL, "learner": learner})})


def test_the_fm_term_is_the_sum_over_pairs_of_fields() -> None:
    fields = np.random.default_rng(0).normal(size=(3, 4, 5)).astype(np.float32)
    pairs = sum(
        (fields[:, i] * fields[:, j]).sum(axis=-1) for i in range(4) for j in range(i + 1, 4)
    )
    got = FMInteraction()(paddle.to_tensor(fields)).numpy()
    np.testing.assert_allclose(got, pairs, rtol=1e-5, atol=1e-5)


def test_the_setting_builds_deepfm() -> None:
    assert isinstance(make_learner(ModelConfig.model_validate({**SMALL, "learner": "deepfm"})), DeepFMLearner)


def test_tables_of_different_dims_are_refused_in_one_line() -> None:
    tables = [{**t, "dim": 4 + 4 * k} for k, t in enumerate(small_tables(256, 64))]
    with pytest.raises(ConfigError, match="one embedding dim") as info:
        DeepFMLearner(ModelConfig.model_validate({**SMALL, "tables": tables, "learner": "deepfm"}))
    assert "\n" not in str(info.value)


def test_deepfm_trains_in_the_loop_snapshots_as_deepfm_and_serves_as_it_scores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamrec.serving.export import export_snapshot
    from streamrec.serving.scorer import Candidate, ExportedModel

    script = ScriptedConsumer([[valid(n) for n in range(6)]])
    monkeypatch.setattr(runner_module, "make_consumer", lambda *_, **__: script)
    cfg = deepfm_config(tmp_path)
    learner = make_learner(cfg.model)
    LearnerRunner(cfg, learner, dead_letters=writer(FakeProducer())).run()
    manifest = SnapshotStore(tmp_path).latest()
    assert manifest is not None and manifest.learner == "deepfm" and manifest.samples_trained == 6

    path = export_snapshot(SnapshotStore(tmp_path), manifest.version)
    model = ExportedModel(path)
    assert model.contract["model"]["learner"] == "deepfm"
    batch = SampleColumns.from_samples([
        Sample("a", "u1", 1, "i1", "c1", 1, ("i2", "i3"), ("c2", "c3")),
        Sample("b", "u9", 1, "new", "c4", 0, (), ()),
    ])
    np.testing.assert_allclose(model.score_batch(batch), learner.predict_many(batch), atol=1e-5)
    served = model.score("u1", [("i2", "c2"), ("i3", "c3")], [Candidate("i1", "c1")])
    np.testing.assert_allclose(served, learner.predict_many(batch)[:1], atol=1e-5)


def test_a_deepfm_snapshot_resumed_as_din_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = ScriptedConsumer([[valid(n) for n in range(6)]])
    monkeypatch.setattr(runner_module, "make_consumer", lambda *_, **__: script)
    cfg = deepfm_config(tmp_path)
    LearnerRunner(cfg, make_learner(cfg.model), dead_letters=writer(FakeProducer())).run()
    din_cfg = deepfm_config(tmp_path, learner="din")
    with pytest.raises(ConfigError) as info:
        LearnerRunner(din_cfg, make_learner(din_cfg.model), dead_letters=writer(FakeProducer()))
    message = str(info.value)
    assert "\n" not in message and "'deepfm'" in message and "'din'" in message
