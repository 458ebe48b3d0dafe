"""The learner chosen by configuration: ``STREAMREC_MODEL__LEARNER``."""

from __future__ import annotations

import pytest

from streamrec.config import ModelConfig, StreamrecConfig
from streamrec.errors import ConfigError
from streamrec.learner.registry import make_learner
from tests.unit.learner.tiny_learner import CLASS_PATH, TinyLearner


def test_the_default_learner_is_din() -> None:
    from streamrec.learner.din import DINLearner

    assert ModelConfig().learner == "din"
    assert isinstance(make_learner(ModelConfig(device="cpu")), DINLearner)


def test_the_setting_reads_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMREC_MODEL__LEARNER", CLASS_PATH)
    assert StreamrecConfig().model.learner == CLASS_PATH


def test_a_class_path_loads_that_learner_built_from_the_model_section() -> None:
    learner = make_learner(ModelConfig(learner=CLASS_PATH, learning_rate=1e-3))
    assert isinstance(learner, TinyLearner)
    assert learner.prior == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("no_such_module_xyz:Learner", "cannot import no_such_module_xyz"),
        ("tests.unit.learner.tiny_learner:Missing", "has no Missing"),
        ("tests.unit.learner.tiny_learner:NotALearner", "lacks learn_many"),
        ("dn", "neither a built-in learner (deepfm, din) nor a package.module:ClassName"),
        # noted by the model tour: a TypeError traceback from the constructor
        ("tests.unit.learner.tiny_learner:NeedsArguments",
         "NeedsArguments has no from_config(model_cfg) and cannot be built with no arguments: "),
    ],
)
def test_a_bad_value_is_one_line_naming_the_setting(value: str, why: str) -> None:
    with pytest.raises(ConfigError) as info:
        make_learner(ModelConfig(learner=value))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"STREAMREC_MODEL__LEARNER={value!r}")
    assert why in message


@pytest.mark.parametrize("kind", ["finetune", "ewc"])
def test_the_backtesters_model_strategies_train_the_configured_learner(kind: str) -> None:
    from streamrec.replay.strategies import Strategy

    strategy = Strategy(kind, kind, model=ModelConfig(learner=CLASS_PATH))  # type: ignore[arg-type]  # kind: a Literal
    assert isinstance(strategy.make_learner(), TinyLearner)
