"""A learner built for an export, and a served export loaded to judge by, are freed when dropped.

The learner's batch loop collects garbage rarely (`streamrec.gcsettings`: a young threshold of
100,000 net allocations, the startup heap frozen), so what lives in a reference cycle stays
until a full collection, which that loop hardly ever reaches. Paddle's optimizer keeps a bound
method of itself (``clear_gradients``), which held every parameter and Adam moment of each
learner the gate built from a snapshot to export it; an export's model held itself through its
combiner (a bound ``_run``). Found by the soak tour: `streamrec learner run --interval 10
--snapshot-every 3` grew from 405 MB to 3.7 GB in seven minutes, about 200 MB a snapshot,
and stayed flat with a full collection after each one.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamrec.learner.din import DINLearner
from streamrec.serving.engines import EngineChoice
from streamrec.serving.export import write_export
from streamrec.serving.scorer import ExportedModel
from tests.unit.serving.test_export import ENGINES, config, trained


@pytest.fixture
def no_collector() -> Iterator[None]:
    """Reference counting alone frees what is dropped, as in the batch loops between collections."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


def test_a_dropped_learner_frees_its_optimizer_and_parameters(no_collector: None) -> None:
    """Three learners built and dropped: none of their optimizers or parameters is left."""
    refs = []
    for _ in range(3):
        learner = DINLearner(config())
        refs.append(weakref.ref(learner._optimizer))
        refs.extend(weakref.ref(p) for p in learner.model.parameters())
        del learner
    alive = sum(ref() is not None for ref in refs)
    assert alive == 0, f"{alive} of {len(refs)} optimizers and parameters outlived their learners"


def test_a_dropped_learner_still_clears_its_gradients() -> None:
    """The optimizer's ``clear_gradients`` (Paddle's name for ``clear_grad``) still works."""
    learner = trained(config())
    learner._optimizer.clear_gradients()
    assert all(p.grad is None or not p.grad.abs().sum().item() for p in learner.model.parameters())


@pytest.mark.parametrize("engine", ENGINES)
def test_a_dropped_export_model_is_freed(tmp_path: Path, engine: EngineChoice, no_collector: None) -> None:
    """An `ExportedModel` replaced by the next version's (the gate's, a server's) is freed at once."""
    path = write_export(trained(config()), tmp_path / "v000001", 1)
    refs = []
    for _ in range(3):
        model = ExportedModel(path, engine=engine)
        refs.append(weakref.ref(model))
        del model
    alive = sum(ref() is not None for ref in refs)
    assert alive == 0, f"{alive} of {len(refs)} dropped export models are still alive"
