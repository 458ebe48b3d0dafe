"""What runs an export's scoring graph: Paddle Inference or ONNX Runtime, behind one protocol.

Every export holds the graph for Paddle Inference (``model.json`` + ``model.pdiparams``); one
written where paddle2onnx is installed also holds it as ONNX (``model.onnx``, named by the
contract's ``onnx`` entry; `streamrec.serving.onnxfile`). `open_engine` picks by the serving
setting ``engine``: ``auto`` runs ONNX Runtime when the export has the ONNX graph and
onnxruntime imports (a quarter to a third of Paddle's time a request, measured on a 2-core
machine, the same scores within 1e-7), else Paddle; ``onnx`` asks for ONNX Runtime and, when it
cannot be used, falls back to Paddle with one warning; ``paddle`` always runs Paddle.

Falling back rather than refusing: an export without the ONNX graph (written before it
existed, or where the conversion failed) can be promoted, rolled back to or put in a canary
at any time while serve runs, and refusing it then would stop serving a model Paddle scores
correctly. The engine each version runs is logged when it loads and reported in ``/metrics``
(``streamrec_serving_engine_info`` for the served version, ``streamrec_serving_arm_engine_info``
for each arm of a canary or A/B test) and ``/readyz``.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from streamrec.errors import InvalidSnapshot

logger = logging.getLogger(__name__)

EngineChoice = Literal["auto", "onnx", "paddle"]
ENGINES = ("auto", "onnx", "paddle")
# ONNX Runtime's log severity: 3 (errors). Its warnings on a converted graph (unused
# initializers it removes, unsqueezes it keeps) are many lines per load and need no action.
_ORT_LOG_SEVERITY = 3


class Engine(Protocol):
    """Runs a scoring graph: the contract's inputs by name in, the [B] float32 scores out."""

    name: str  # "paddle" or "onnx": what /metrics and /readyz report

    def run(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        """float32 [B] scores of one call; one call at a time (the caller serializes them)."""
        ...


class PaddleEngine:
    """Paddle Inference on the CPU over ``model.json`` + ``model.pdiparams``.

    oneDNN stays off: on this graph (embedding lookups, a small attention unit and MLP, 100
    candidates) Paddle's plain CPU kernels take 2.2-2.5 ms a request against oneDNN's 4.1-4.3 ms,
    with the same scores within 1e-7 (docs/serving.md, "Engines").
    """

    name = "paddle"

    def __init__(self, path: Path, threads: int = 1) -> None:
        """A predictor of the export at ``path`` running on ``threads`` math threads.

        Raises:
            InvalidSnapshot: Paddle Inference cannot load the graph (a file cut short, say): the
                server falls back as from any damaged export, rather than stopping on a traceback.
        """
        from paddle import inference

        config = inference.Config(str(path / "model.json"), str(path / "model.pdiparams"))
        config.disable_gpu()
        config.disable_mkldnn()
        config.set_cpu_math_library_num_threads(threads)
        config.disable_glog_info()
        try:
            self._predictor = inference.create_predictor(config)
        except Exception as exc:  # Paddle raises RuntimeError, ValueError, OSError... by the fault
            raise InvalidSnapshot(
                f"Paddle Inference cannot load {path / 'model.json'} and model.pdiparams: {_line(exc)}"
            ) from exc

    def run(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        """float32 [B]."""
        predictor = self._predictor
        for name in predictor.get_input_names():
            handle = predictor.get_input_handle(name)
            array = np.ascontiguousarray(inputs[name])
            handle.reshape(array.shape)
            handle.copy_from_cpu(array)
        predictor.run()
        output = predictor.get_output_handle(predictor.get_output_names()[0])
        return np.asarray(output.copy_to_cpu(), np.float32)


class OnnxEngine:
    """ONNX Runtime's CPU provider over the export's ONNX graph, sequential execution."""

    name = "onnx"

    def __init__(self, model: Path, threads: int = 1) -> None:
        """A session of the ONNX file ``model`` with ``threads`` intra-op threads.

        Raises:
            InvalidSnapshot: onnxruntime cannot load the file.
        """
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.log_severity_level = _ORT_LOG_SEVERITY
        try:
            self._session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph/... types
            raise InvalidSnapshot(f"onnxruntime cannot load {model}: {_line(exc)}") from exc
        self._inputs = [i.name for i in self._session.get_inputs()]
        self._output = self._session.get_outputs()[0].name

    def run(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        """float32 [B]."""
        feed = {name: np.ascontiguousarray(inputs[name]) for name in self._inputs}
        (scores,) = self._session.run([self._output], feed)
        return np.asarray(scores, np.float32)


def _line(exc: BaseException) -> str:
    """An engine's error in one line (Paddle's span several, with a hint and a source path)."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def onnx_file(contract: Mapping[str, Any], path: Path) -> Path | None:
    """The export's ONNX graph as its contract names it; None when it names none."""
    entry = contract.get("onnx")
    if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
        return None
    return path / entry["file"]


def onnxruntime_available() -> bool:
    """Whether onnxruntime is installed (the ``onnx`` extra)."""
    return importlib.util.find_spec("onnxruntime") is not None


def open_engine(path: Path, contract: Mapping[str, Any], choice: EngineChoice, threads: int = 1) -> Engine:
    """The engine to score the export at ``path`` with, by the ``engine`` setting ``choice``.

    ``auto`` and ``onnx`` run ONNX Runtime when the contract names an ONNX graph, onnxruntime
    imports and loads it; otherwise Paddle, logged as a warning when ``onnx`` was asked for.
    """
    if choice != "paddle":
        model = onnx_file(contract, path)
        why = None
        if model is None:
            why = "the export has no ONNX graph (written before it existed or without paddle2onnx)"
        elif not onnxruntime_available():
            why = "onnxruntime is not installed (pip install 'streamrec[onnx]')"
        else:
            try:
                return OnnxEngine(model, threads)
            except InvalidSnapshot as exc:
                why = str(exc)
        if choice == "onnx":
            logger.warning("engine=onnx asked for, but export=%s runs on paddle: %s", path.name, why)
        else:
            logger.info("export=%s runs on paddle: %s", path.name, why)
    return PaddleEngine(path, threads)
