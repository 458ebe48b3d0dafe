"""The learner chosen by configuration (``STREAMREC_MODEL__LEARNER``): one factory for all.

``din`` names the built-in DIN, ``deepfm`` the built-in DeepFM;
``package.module:ClassName`` names a user's own class, loaded as feast loads its backends.
A class with a ``from_config(model_cfg)`` classmethod is built by it; any other with no
arguments (its own defaults). Either way it must have the methods of the `Learner` contract.
Under a schema with declared features (``STREAMREC_FEATURES``) the learner is given it: a
built-in as ``schema`` (DIN and DeepFM read every declared feature), a user's class as
``from_config(model_cfg, schema)`` (a class that takes no schema is refused then, in one line).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import NoReturn, cast

from streamrec.config import ModelConfig
from streamrec.errors import ConfigError
from streamrec.features import FeatureSchema
from streamrec.learner.base import Learner

SETTING = "STREAMREC_MODEL__LEARNER"
DEFAULT_LEARNER = "din"
# The methods the learner loop calls: a class lacking one fails at start, not mid-stream.
CONTRACT_METHODS = ("predict_many", "learn_many", "is_known", "state_arrays", "load_state_arrays")


def _din(cfg: ModelConfig, schema: FeatureSchema) -> Learner:
    from streamrec.learner.din import DINLearner  # Paddle loads only when DIN is chosen

    return DINLearner(cfg, schema=schema)


def _deepfm(cfg: ModelConfig, schema: FeatureSchema) -> Learner:
    from streamrec.learner.deepfm_learner import DeepFMLearner

    return DeepFMLearner(cfg, schema=schema)


BUILTINS: dict[str, Callable[[ModelConfig, FeatureSchema], Learner]] = {"din": _din, "deepfm": _deepfm}


def make_learner(cfg: ModelConfig, schema: FeatureSchema | None = None) -> Learner:
    """A fresh learner of the type ``cfg.learner`` names, built from ``cfg``, reading ``schema``.

    Raises:
        ConfigError: the value names no built-in, its class does not import, the class
            lacks a method of the contract, or features are declared and it takes no schema.
    """
    schema = FeatureSchema.default() if schema is None else schema
    builtin = BUILTINS.get(cfg.learner)
    if builtin is not None:
        return builtin(cfg, schema)
    cls = load_class(cfg.learner)
    from_config = getattr(cls, "from_config", None)
    if schema.extras:
        if not callable(from_config):
            _refuse(cfg.learner, "features are declared (STREAMREC_FEATURES) and it has no "
                    "from_config(model_cfg, schema) to take them")
        try:
            return cast(Learner, from_config(cfg, schema))
        except TypeError as exc:
            _refuse(cfg.learner, f"features are declared and from_config(model_cfg, schema) failed: {exc}")
    learner = from_config(cfg) if callable(from_config) else cls()
    return cast(Learner, learner)


def reads_model_settings(value: str) -> bool:
    """Whether the learner ``value`` names is built from the model settings.

    A built-in is, and a class with ``from_config``; one built with no arguments reads none.

    Raises:
        ConfigError: as `load_class`.
    """
    return value in BUILTINS or callable(getattr(load_class(value), "from_config", None))


def check_setting(value: str) -> None:
    """Fail now, before any service starts, when ``value`` names no learner that loads.

    Raises:
        ConfigError: as `make_learner` would.
    """
    if value not in BUILTINS:
        load_class(value)


def load_class(value: str) -> type:
    """The class ``package.module:ClassName`` names, checked against the contract.

    Raises:
        ConfigError: one line naming the setting, its value and what is wrong.
    """
    module_name, sep, class_name = value.partition(":")
    if not sep or not module_name or not class_name:
        _refuse(value, f"neither a built-in learner ({', '.join(sorted(BUILTINS))}) nor a "
                "package.module:ClassName")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        _refuse(value, f"cannot import {module_name}: {exc}")
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        _refuse(value, f"{module_name} has no {class_name} class")
    missing = [name for name in CONTRACT_METHODS if not callable(getattr(cls, name, None))]
    if missing:
        _refuse(value, f"{class_name} is not a learner: it lacks {', '.join(missing)}")
    if not callable(getattr(cls, "from_config", None)):
        try:
            inspect.signature(cls).bind()
        except TypeError as exc:
            _refuse(value, f"{class_name} has no from_config(model_cfg) and cannot be built with no "
                    f"arguments: {exc}")
        except ValueError:  # no signature to read (a builtin type): it is tried as it is
            pass
    return cls


def _refuse(value: str, why: str) -> NoReturn:
    raise ConfigError(f"{SETTING}={value!r}: {why}".replace("\n", " "))
