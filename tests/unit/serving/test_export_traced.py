"""An export saves a scoring graph traced once per model shape (`streamrec.serving.traced`).

``paddle.jit.save`` of a new graph traced it anew at every export, and Paddle kept about 5 MB
of each trace for good: a learner exporting every snapshot grew without bound (found by the
long-run tour: 401 MB to 2.1 GB over 200 snapshots). The graph traced once is saved again with
the values of the learner exported then: each export scores as its own learner, on Paddle and
on ONNX Runtime, while the process's memory stays flat.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from streamrec.learner.din import DINLearner
from streamrec.learner.idstats import USER
from streamrec.serving.engines import EngineChoice
from streamrec.serving.export import input_specs, scoring_graph, write_export
from streamrec.serving.scorer import ExportedModel
from streamrec.serving.traced import TracedGraphs
from tests.unit.serving.test_export import ENGINES, TOLERANCE, config, stream, trained


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith("VmRSS")).split()[1]) / 1024


@pytest.mark.parametrize("engine", ENGINES)
def test_each_export_scores_as_its_own_learner_at_that_moment(tmp_path: Path, engine: EngineChoice) -> None:
    """One learner exported, trained on and exported again; then another learner of the same
    shape (as the gate exports each version, a learner built from its snapshot): each export
    holds its learner's weights and id statistics of that moment, not the first one's.
    """
    first = trained(config())
    batch = stream(400, 99, 90_000)
    exports = [write_export(first, tmp_path / "v000001", 1)]
    before = first.predict_many(batch)
    for k in range(2):
        first.learn_many(stream(600, 10 + k, 40_000 + k * 10_000))
    exports.append(write_export(first, tmp_path / "v000002", 2))
    after = first.predict_many(batch)
    other = DINLearner(config())
    other.learn_many(stream(600, 50, 0))
    exports.append(write_export(other, tmp_path / "v000003", 3))
    want = [before, after, other.predict_many(batch)]
    assert np.abs(want[1] - want[0]).max() > 100 * TOLERANCE  # the learner moved between exports
    for export, scores in zip(exports, want, strict=True):
        got = ExportedModel(export, engine=engine).score_batch(batch)
        assert np.abs(got - scores).max() <= TOLERANCE, export.name


def test_exports_of_one_model_shape_leave_the_process_memory_flat(tmp_path: Path) -> None:
    """Twenty exports, each of a learner built anew: about 5 MB each before (measured 90 MB or
    more), now within noise once the first exports made the graphs.
    """
    learner = DINLearner(config())
    for k in range(3):
        write_export(learner, tmp_path / f"warm{k}", k + 1)
    start = rss_mb()
    for k in range(20):
        learner = DINLearner(config())
        learner.learn_many(stream(100, k, k * 1_000))
        write_export(learner, tmp_path / f"v{k:06d}", k + 4)
    grown = rss_mb() - start
    assert grown < 25, f"the process grew {grown:.0f} MB over 20 exports"


def test_the_plain_and_onnx_graphs_of_a_shape_share_one_twin_model() -> None:
    """An export takes both graphs of its model's shape at once: one twin holds the weights for
    both (two twins doubled the export's memory, and copied the weights twice), and each graph
    holds the exported learner's id statistics.
    """
    learner = trained(config())
    graphs = TracedGraphs()
    specs = input_specs(learner.cfg, learner.plan)
    plain, in_forms = graphs.graphs(learner, specs, scoring_graph, onnx=True)
    assert in_forms is not None and in_forms.model is plain.model
    assert plain.model is not learner.model  # an export never writes into a learner that trains
    assert graphs.graphs(learner, specs, scoring_graph) == (plain, None)  # the same, traced once
    weights = learner.model.state_dict()
    for name, value in plain.model.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), weights[name].numpy())
    stats = learner.id_stats
    assert stats is not None
    rate = stats.positives[USER].sum() / stats.samples[USER].sum()
    for graph in (plain, in_forms):
        assert float(graph.priors.numpy()[0]) == pytest.approx(rate, rel=1e-6)
