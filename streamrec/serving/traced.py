"""The scoring graphs an export saves, each traced once per model shape.

``paddle.jit.save`` of a layer traces its ``forward`` into a static program, and Paddle keeps
part of every trace for good (its origin-info map, the transformed source in ``linecache``, the
program itself): measured on Paddle 3.3.1's CPU wheel, about 5 MB an export without bound, in a
learner that exports every snapshot it writes (the gate's exports), and 0.9 s of CPU a save.
A graph whose ``forward`` was converted once (``paddle.jit.to_static``) is saved again from its
cached program with its parameters' values of the moment: no trace, about 0.14 s, and no
growth.

So an export takes the graphs traced for its model's shape (`TracedGraphs.graphs`), copies the
exported learner's weights and id statistics into them, and saves them. The learners exported
are often built anew from their snapshots (the gate exports each version from disk), so the
graphs hold a model of their own, a twin made once per shape: an export never writes into the
weights of a learner that trains. The graph with layers in their ONNX forms (`onnx_forms`) is
traced apart, under those forms, over the same twin: one copy of the weights an export.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
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
GraphOf = Callable[[TableLearner], ScoringGraph]


@dataclass
class _Shape:
    """One model shape's twin and the graphs traced over it: plain (False) and in ONNX forms (True)."""

    twin: TableLearner
    graphs: dict[bool, ScoringGraph] = field(default_factory=dict)


class TracedGraphs:
    """Scoring graphs traced once per model shape, refreshed with each exported learner's values."""

    def __init__(self) -> None:
        """No graph yet."""
        self._shapes: OrderedDict[Hashable, _Shape] = OrderedDict()
        #: Held from taking the graphs until they are saved: two exports at once would mix their values.
        self.lock = threading.RLock()

    def graphs(
        self, learner: TableLearner, specs: list[Any], graph_of: GraphOf, onnx: bool = False
    ) -> tuple[ScoringGraph, ScoringGraph | None]:
        """``learner``'s scoring graph and, with ``onnx``, the one in its layers' ONNX forms (else None).

        Each one's ``forward`` was converted once for ``specs``; both hold ``learner``'s values
        now, in one twin model of its shape, copied in once. ``graph_of`` makes a scoring graph
        of a learner (its model, its id statistics).
        """
        key = signature(learner, specs)
        with self.lock:
            shape = self._shapes.get(key)
            if shape is None:
                twin = cast(TableLearner, make_learner(learner.cfg, learner.schema))
                twin.load_state_arrays(learner.state_arrays())
                shape = self._shapes[key] = _Shape(twin)
                while len(self._shapes) > _KEPT:
                    self._shapes.popitem(last=False)
            else:
                self._shapes.move_to_end(key)
                shape.twin.model.set_state_dict(learner.model.state_dict())
            made = []
            for forms in (False, True) if onnx else (False,):
                graph = shape.graphs.get(forms)
                if graph is None:
                    graph = shape.graphs[forms] = _traced(shape.twin, specs, graph_of, forms)
                graph.set_stats(*_stats(learner))  # the twin's own are those it was made with
                graph.eval()
                made.append(graph)
        return made[0], (made[1] if onnx else None)


def _traced(twin: TableLearner, specs: list[Any], graph_of: GraphOf, onnx: bool) -> ScoringGraph:
    """``twin``'s scoring graph, its ``forward`` converted (and with ``onnx`` traced, under the forms)."""
    graph = graph_of(twin)
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
