"""The scoring graphs an export saves, each traced once per model shape.

``paddle.jit.save`` of a layer traces its ``forward`` into a static program, and Paddle keeps
part of every trace for good (its origin-info map, the transformed source in ``linecache``, the
program itself): measured on Paddle 3.3.1's CPU wheel, about 5 MB an export without bound, in a
learner that exports every snapshot it writes (the gate's exports), and 0.9 s of CPU a save.
A graph whose ``forward`` was converted once (``paddle.jit.to_static``) is saved again from its
cached program with its parameters' values of the moment: no trace, about 0.14 s, and no
growth.

So an export takes the graph traced for its model's shape (`TracedGraphs.graph`), copies the
exported learner's weights and id statistics into it, and saves that. The learners exported
are often built anew from their snapshots (the gate exports each version from disk), so the
graphs hold a model of their own, a twin made once per shape: an export never writes into the
weights of a learner that trains. A graph with layers in their ONNX forms (`onnx_forms`) is
traced apart, under those forms.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any, cast

import numpy as np
import paddle

from streamrec.learner.onnxforms import onnx_forms
from streamrec.learner.registry import make_learner
from streamrec.learner.trainer import TableLearner
from streamrec.serving.graph import ScoringGraph

#: Model shapes whose graphs are kept: a dynamic table that grows changes the shape once in a while.
_KEPT = 2

#: Makes the scoring graph of a learner's model (`streamrec.serving.export.scoring_graph`).
GraphOf = Any


class TracedGraphs:
    """Scoring graphs traced once per model shape, refreshed with each exported learner's values."""

    def __init__(self) -> None:
        """No graph yet."""
        self._graphs: OrderedDict[Hashable, ScoringGraph] = OrderedDict()
        #: Held from taking a graph until it is saved: two exports at once would mix their values.
        self.lock = threading.RLock()

    def graph(
        self, learner: TableLearner, specs: list[Any], graph_of: GraphOf, onnx: bool = False
    ) -> ScoringGraph:
        """``learner``'s scoring graph, its ``forward`` converted once for ``specs``, holding its values now.

        ``graph_of`` makes a scoring graph of a learner (its model, its id statistics); the
        first graph of a shape is made of a twin of ``learner``, with ``onnx`` under its
        layers' ONNX forms.
        """
        key = (onnx, signature(learner, specs))
        with self.lock:
            graph = self._graphs.get(key)
            if graph is None:
                graph = self._traced(learner, specs, graph_of, onnx)
                self._graphs[key] = graph
                while len(self._graphs) > _KEPT:
                    self._graphs.popitem(last=False)
            else:
                self._graphs.move_to_end(key)
                graph.model.set_state_dict(learner.model.state_dict())
                graph.set_stats(*_stats(learner))
        graph.eval()
        return graph

    @staticmethod
    def _traced(learner: TableLearner, specs: list[Any], graph_of: GraphOf, onnx: bool) -> ScoringGraph:
        twin = cast(TableLearner, make_learner(learner.cfg, learner.schema))
        twin.load_state_arrays(learner.state_arrays())
        graph: ScoringGraph = graph_of(twin)
        converted = paddle.jit.to_static(graph.forward, input_spec=specs, full_graph=True)
        setattr(graph, "forward", converted)  # noqa: B010 - the instance's, as jit.save reads it
        graph.eval()
        if onnx:  # traced now, under the forms; later saves reuse the program
            with onnx_forms(graph):
                converted.concrete_program  # noqa: B018 - the trace itself
        return graph


def signature(learner: TableLearner, specs: list[Any]) -> Hashable:
    """What a traced graph's program is fixed by: the model's settings, features and shapes, the inputs."""
    shapes = tuple((name, tuple(value.shape)) for name, value in learner.model.state_dict().items())
    samples, positives = _stats(learner)
    stats = None if samples is None else tuple(sorted((n, a.shape) for n, a in samples.items()))
    inputs = repr(specs)
    return (type(learner), learner.cfg.model_dump_json(), learner.schema.fingerprint, shapes, stats, inputs)


def _stats(learner: TableLearner) -> tuple[dict[str, np.ndarray] | None, dict[str, np.ndarray] | None]:
    stats = learner.id_stats
    if stats is None:
        return None, None
    return stats.samples, stats.positives
