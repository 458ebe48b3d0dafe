"""Whether an export's scoring graphs load and answer finite scores, as serving runs them.

`require_finite_scores` is serving's own check at each load (`streamrec.serving.scorer.ExportedModel`):
one seeded probe batch of the contract's inputs (`streamrec.serving.onnxfile.probe_inputs`).
`graphs_problem` runs it on every graph an export holds, for `snapshot verify` and
`snapshot export --rebuild`, which import Paddle for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from streamrec.errors import InvalidSnapshot, SnapshotError
from streamrec.serving.engines import Engine, OnnxEngine, PaddleEngine, onnx_file, onnxruntime_available
from streamrec.serving.loading import ExportContents
from streamrec.serving.onnxfile import probe_inputs


def require_finite_scores(engine: Engine, contract: Mapping[str, Any], path: Path) -> None:
    """Raise unless ``engine`` scores a seeded probe batch of the contract's inputs as finite numbers.

    A graph whose weights are NaN (or absent, where an engine runs it anyway) would answer NaN
    to every request; one run of 64 candidates at load says so first.

    Raises:
        InvalidSnapshot: the scores are not all finite, or the engine fails on the batch.
    """
    try:
        scores = engine.run(probe_inputs(contract, np.random.default_rng(0)))
    except Exception as exc:  # an engine's own error types
        why = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise InvalidSnapshot(f"{path}: its {engine.name} graph fails on a probe batch: {why}") from exc
    if not np.isfinite(scores).all():
        raise InvalidSnapshot(
            f"{path}: its {engine.name} graph scores a probe batch as NaN or infinity (its weights): "
            f"rebuild the export with `streamrec snapshot export {contract.get('version')} --rebuild`"
        )


def graphs_problem(export: ExportContents) -> str | None:
    """Why a graph of an export (as `read_export` read it whole) does not load or score, or None.

    Both graphs an export holds, each as serving runs it: Paddle's, which every engine setting may
    run (``auto`` falls back to it), and the ONNX graph where the contract names one and
    onnxruntime is installed (``auto`` runs it). `snapshot verify` asks it; serving loads one.
    """
    path, contract = export.path, export.contract
    try:
        makers: list[Callable[[], Engine]] = [lambda: PaddleEngine(path)]
        model = onnx_file(contract, path)
        if model is not None and onnxruntime_available():
            makers.append(lambda: OnnxEngine(model))
        for make in makers:
            require_finite_scores(make(), contract, path)
    except SnapshotError as exc:  # InvalidSnapshot: a graph that does not load or score
        return str(exc)
    return None
