"""Every learner against the learner contract (`streamrec.learner.checks`).

One parameter per learner and check. A new learner is one more `Entry` in
``LEARNERS``: its factory, what it promises, and the optional packages it needs (without
them its checks are skipped, with the reason). A check that fails on a learner for a known
reason is listed in ``KNOWN_FAILURES`` with that reason (a strict xfail: once fixed, it
fails until removed from the list).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamrec.config import ModelConfig, TableConfig
from streamrec.errors import ConfigError
from streamrec.features import FeatureSchema, FeatureSpec
from streamrec.learner.base import Learner
from streamrec.learner.checks import LearnerFactory, Promises, yield_checks
from streamrec.learner.columns import SampleColumns
from streamrec.replay.baselines import ItemRateLearner, PopularityLearner
from streamrec.replay.features import FeaturesLearner
from tests.support import small_tables

# As small as a DIN gets with every part in (dynamic ids, id statistics, wide, match
# features): each check builds a few and trains them on a few hundred samples.
DIN_CONFIG = ModelConfig.model_validate({
    "tables": small_tables(256, 64, dim=4), "sequence_length": 6, "attention_units": (8,),
    "mlp_units": (8,), "train_batch_size": 64, "device": "cpu", "learning_rate": 0.01,
})


# The training state the default leaves out: online EWC's, a user table's, two passes.
DIN_EWC_CONFIG = DIN_CONFIG.model_copy(update={
    "tables": (*DIN_CONFIG.tables, TableConfig(name="user", feature="user", rows=64, dim=4)),
    "ewc_lambda": 0.5, "passes": 2,
})


# Declared features of every kind and role (the checks' samples carry none: each reads absent).
FEATURES = FeatureSchema.of([
    FeatureSpec(name="genres", kind="ids", max_ids=3),
    FeatureSpec(name="rating", kind="number", outcome=True, transform="standardize"),
    FeatureSpec(name="device", role="context"),
    FeatureSpec(name="age", kind="number", role="user", transform="bucket", boundaries=(18.0, 30.0)),
    FeatureSpec(name="price", kind="number", transform="log1p"),
])


def din(cfg: ModelConfig = DIN_CONFIG, schema: FeatureSchema | None = None) -> Learner:
    from streamrec.learner.din import DINLearner

    return DINLearner(cfg, schema=schema)


def deepfm(cfg: ModelConfig = DIN_CONFIG, schema: FeatureSchema | None = None) -> Learner:
    from streamrec.learner.deepfm_learner import DeepFMLearner

    return DeepFMLearner(cfg.model_copy(update={"learner": "deepfm"}), schema=schema)


def din_export(learner: Learner, root: Path) -> Callable[[SampleColumns], np.ndarray]:
    """The serving path: a snapshot of the learner, exported, scored by Paddle Inference."""
    from streamrec.learner.snapshotting import group_state
    from streamrec.learner.trainer import TableLearner
    from streamrec.serving.export import export_snapshot
    from streamrec.serving.scorer import ExportedModel
    from streamrec.snapshots.store import SnapshotStore

    assert isinstance(learner, TableLearner)  # DIN or DeepFM
    store = SnapshotStore(root)
    manifest = store.write(
        group_state(learner.state_arrays()), micro_batches=1, samples_trained=0, positions=(),
        config={"model": learner.cfg.model_dump(mode="json"), "features": learner.schema.to_json()},
    )
    return ExportedModel(export_snapshot(store, manifest.version)).score_batch


def vw() -> Learner:
    # The vw extra's learner (streamrec.replay.vw): optional, it needs the vowpalwabbit package.
    from streamrec.replay.vw import VWLearner  # type: ignore[import-not-found,unused-ignore]  # see above

    learner: Learner = VWLearner()
    return learner


@dataclass(frozen=True)
class Entry:
    """A learner under test: its name in test ids, factory, promises, optional packages."""

    name: str
    factory: LearnerFactory
    promises: Promises = Promises()
    requires: tuple[str, ...] = ()


LEARNERS = (
    Entry("din", din, Promises(export=din_export), requires=("paddle",)),
    Entry("din-ewc-user", partial(din, DIN_EWC_CONFIG), Promises(export=din_export), requires=("paddle",)),
    Entry("din-features", partial(din, schema=FEATURES), Promises(export=din_export), requires=("paddle",)),
    Entry("din-features-ewc-user", partial(din, DIN_EWC_CONFIG, FEATURES), Promises(export=din_export),
          requires=("paddle",)),
    Entry("deepfm", deepfm, Promises(export=din_export), requires=("paddle",)),
    Entry(
        "deepfm-ewc-user", partial(deepfm, DIN_EWC_CONFIG), Promises(export=din_export), requires=("paddle",)
    ),
    Entry(
        "deepfm-features", partial(deepfm, schema=FEATURES), Promises(export=din_export), requires=("paddle",)
    ),
    Entry("deepfm-features-ewc-user", partial(deepfm, DIN_EWC_CONFIG, FEATURES), Promises(export=din_export),
          requires=("paddle",)),
    Entry("popularity", PopularityLearner),
    Entry("item-rate", ItemRateLearner),
    Entry("features", FeaturesLearner, Promises(knows_targets=False)),
    Entry("vw", vw, requires=("vowpalwabbit", "streamrec.replay.vw")),
)

#: (learner, check) -> why it fails today.
KNOWN_FAILURES: dict[tuple[str, str], str] = {}


def _missing(entry: Entry) -> list[str]:
    """The optional packages ``entry`` needs that are not installed."""
    return [m for m in entry.requires if importlib.util.find_spec(m) is None]


def _available(entry: Entry) -> bool:
    return not _missing(entry)


def _params() -> list[Any]:  # pytest.param's type is private to pytest
    params = []
    for entry in LEARNERS:
        missing = _missing(entry)
        for check in yield_checks(entry.factory, entry.promises):
            marks = []
            if missing:
                marks.append(pytest.mark.skip(reason=f"{entry.name} needs {', '.join(missing)}"))
            reason = KNOWN_FAILURES.get((entry.name, check.name))
            if reason is not None:
                marks.append(pytest.mark.xfail(reason=reason))
            params.append(pytest.param(check, id=f"{entry.name}-{check.name}", marks=marks))
    return params


@pytest.mark.parametrize("check", _params())
def test_contract(check: Callable[[], None]) -> None:
    check()


def test_every_learner_runs_the_core_checks() -> None:
    """No promise left out drops a check every learner owes."""
    core = {"scores_before_training", "predict_changes_nothing", "empty_batch", "one_sample_batch",
            "unknown_ids", "state_round_trip", "state_is_plain_arrays", "is_known"}
    for entry in LEARNERS:
        assert core <= {c.name for c in yield_checks(entry.factory, entry.promises)}, entry.name


def test_the_documented_example_learner_passes_its_checks() -> None:
    """The example in docs/concepts/model.md ("Writing your own learner") runs as written."""
    page = (Path(__file__).parents[3] / "docs" / "concepts" / "model.md").read_text()
    section = page.split("## Writing your own learner", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert "check_learner(GlobalRate" in code
    exec(compile(code, "docs/concepts/model.md", "exec"), {"__name__": "model_md"})


def test_every_backtester_strategy_runs_a_checked_learner() -> None:
    """A new strategy's learner fails here until it has its line in ``LEARNERS``."""
    from streamrec.replay.strategies import KINDS, Strategy

    checked = {type(entry.factory()) for entry in LEARNERS if _available(entry)}
    for kind in KINDS:
        try:
            learner = Strategy(kind, kind).make_learner()
        except (ImportError, ConfigError):  # an optional package missing: its entry is skipped too
            continue
        assert type(learner) in checked, f"strategy {kind}: add {type(learner).__name__} to LEARNERS"
