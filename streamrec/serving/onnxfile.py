"""An export's scoring graph as ONNX, for ONNX Runtime (`streamrec.serving.engines`).

paddle2onnx converts the Paddle graph an export holds (``model.json`` + ``model.pdiparams``)
into ``model.onnx`` (each repeated constant kept once), written into the export before it is
sealed so its checksum is recorded with the others; the contract names it in its ``onnx``
entry. The converted graph is kept only when ONNX Runtime scores a probe batch as Paddle
Inference does (within `PARITY`), so a graph that converts but computes something else never
reaches serving. Without the ``onnx`` extra, or when the conversion or the check fails, the
export is written without it (one log line): serving then runs Paddle.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from streamrec.serving.contract import with_sources
from streamrec.serving.engines import OnnxEngine, PaddleEngine
from streamrec.snapshots.exports import onnx_missing

logger = logging.getLogger(__name__)

ONNX_FILE = "model.onnx"
# What marks the lines paddle2onnx prints (`native_stdout_kept`).
PADDLE2ONNX_MARK = b"Paddle2ONNX"
# Opset 13: the lowest that holds every operator of the scoring graphs (paddle2onnx raises it
# by itself when a graph needs more) and one every onnxruntime since 1.6 runs.
OPSET = 13
# Largest difference in a probe's scores allowed between the engines: float32 kernels that add
# in another order differ by about 1e-7; a wrong conversion differs by far more.
PARITY = 1e-5
_PROBE_ROWS = 64  # candidates in the probe batch
_PROBE_SIZE = 3  # any other dimension the contract leaves open


def write_onnx(
    directory: Path, contract: Mapping[str, Any], source: Path | None = None
) -> dict[str, Any] | None:
    """Convert a Paddle graph to `ONNX_FILE` in ``directory``; its contract entry.

    The graph converted is ``source``'s (a trace of the model in its ONNX forms,
    `streamrec.learner.onnxforms`), else ``directory``'s own; either must score as
    ``directory``'s Paddle graph does. None, with one log line, when paddle2onnx or
    onnxruntime is not installed, or the conversion or the parity check fails (nothing is
    left behind then).
    """
    missing = onnx_missing()
    if missing:
        logger.info(
            "export without %s: %s not installed (pip install 'streamrec[onnx]')",
            ONNX_FILE,
            " and ".join(missing),
        )
        return None
    target = directory / ONNX_FILE
    try:
        target.write_bytes(_convert(directory if source is None else source))
        gap = _parity_gap(directory, target, contract)
    except Exception as exc:  # paddle2onnx and onnxruntime raise many types; none may fail the export
        target.unlink(missing_ok=True)
        logger.warning("export without %s: conversion failed error=%s", ONNX_FILE, exc)
        return None
    if not gap <= PARITY:
        target.unlink()
        logger.warning(
            "export without %s: its scores differ from Paddle's by %.3g (over %g)", ONNX_FILE, gap, PARITY
        )
        return None
    return {
        "file": ONNX_FILE,
        "opset": OPSET,
        "converter": f"paddle2onnx {importlib.metadata.version('paddle2onnx')}",
        "what": "the same scoring graph as ONNX, for onnxruntime: the same inputs and output",
    }


def _convert(directory: Path) -> bytes:
    """``directory``'s Paddle graph (``model.json`` + ``model.pdiparams``) as an ONNX model."""
    with warnings.catch_warnings():  # its import warns that ccache, for C++ extensions, is missing
        warnings.simplefilter("ignore", UserWarning)
        import paddle2onnx

    # No optimizer pass: polygraphy's (the default) pip-installs modules at run time, and
    # onnxruntime folds constants itself when it loads the graph.
    said: list[str] = []
    converted = False
    try:
        with native_stdout_kept(said):
            raw = paddle2onnx.export(
                str(directory / "model.json"),
                str(directory / "model.pdiparams"),
                None,
                opset_version=OPSET,
                enable_onnx_checker=True,
                optimize_tool="None",
            )
        converted = True
    finally:  # after a failure, what it said about it, beside the export's own line
        for line in said:
            logger.log(logging.DEBUG if converted else logging.WARNING, "paddle2onnx: %s", line)
    if not isinstance(raw, bytes) or not raw:
        raise ValueError("paddle2onnx returned no model")
    return dedupe_constants(raw)


@contextmanager
def native_stdout_kept(said: list[str], mark: bytes = PADDLE2ONNX_MARK) -> Iterator[None]:
    """The lines with ``mark`` that the block writes to file descriptor 1 kept in ``said``.

    paddle2onnx's C++ side prints its progress on the process's standard output, three lines a
    conversion, unasked (``verbose=False`` too): there it would break what a command writes
    (JSON), and it filled a learner's log with them at every export. The caller logs them.
    Anything else written there meanwhile (another thread's output) goes back to standard
    output once the block ends; C's buffers are flushed on both sides so nothing crosses over.
    """
    libc = ctypes.CDLL(None) if sys.platform != "win32" else None
    try:
        saved = os.dup(1)
    except OSError:  # no standard output to keep clean
        yield
        return
    if sys.stdout is not None:
        sys.stdout.flush()
    if libc is not None:
        libc.fflush(None)
    with tempfile.TemporaryFile() as kept:
        os.dup2(kept.fileno(), 1)
        try:
            yield
        finally:
            if libc is not None:
                libc.fflush(None)
            os.dup2(saved, 1)
            os.close(saved)
            kept.seek(0)
            rest = b""
            for line in kept.read().splitlines(keepends=True):
                if mark in line:
                    said.append(line.decode(errors="replace").rstrip())
                else:
                    rest += line
            while rest:
                rest = rest[os.write(1, rest) :]


def dedupe_constants(raw: bytes) -> bytes:
    """The ONNX model ``raw`` with each repeated constant kept once (its users read the first).

    paddle2onnx writes some weights twice (an embedding table read by two lookups, say): a
    fifth of the default DIN's file. A graph with subgraphs (If, Loop) is returned as it is.
    """
    import onnx

    model = onnx.load_model_from_string(raw)
    graph = model.graph
    if any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
        for n in graph.node
        for a in n.attribute
    ):
        return raw
    first: dict[bytes, str] = {}
    same: dict[str, str] = {}
    kept = []
    for node in graph.node:
        if node.op_type == "Constant" and len(node.attribute) == 1 and node.attribute[0].name == "value":
            tensor = onnx.TensorProto()
            tensor.CopyFrom(node.attribute[0].t)
            tensor.name = ""  # the same values under another name are the same constant
            key = tensor.SerializeToString(deterministic=True)
            if key in first and node.output[0] not in {o.name for o in graph.output}:
                same[node.output[0]] = first[key]
                continue
            first.setdefault(key, node.output[0])
        kept.append(node)
    if not same:
        return raw
    for node in kept:
        for k, name in enumerate(node.input):
            node.input[k] = same.get(name, name)
    del graph.node[:]
    graph.node.extend(kept)
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


def _parity_gap(directory: Path, model: Path, contract: Mapping[str, Any]) -> float:
    """The largest difference between the two engines' scores of a random probe batch."""
    feed = probe_inputs(contract, np.random.default_rng(0))
    paddle_scores = PaddleEngine(directory).run(feed)
    onnx_scores = OnnxEngine(model).run(feed)
    if paddle_scores.shape != onnx_scores.shape:
        return float("inf")
    return float(np.abs(paddle_scores - onnx_scores).max())


def probe_inputs(contract: Mapping[str, Any], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random inputs as ``contract`` declares them: rows within each table, numbers near 0."""
    rows = {t["name"]: int(t["rows"]) for t in contract["tables"]}
    feature_rows = {f["name"]: int(f.get("rows") or 1) for f in contract.get("features", ())}
    feed = {}
    for spec in with_sources(contract):  # an export written before inputs stated it too
        dims = spec["shape"]
        shape = tuple(_PROBE_ROWS if k == 0 else (_PROBE_SIZE if d == -1 else d) for k, d in enumerate(dims))
        if spec["dtype"] != "int64":
            feed[spec["name"]] = rng.normal(size=shape).astype(spec["dtype"])
            continue
        source = spec.get("source")
        if source == "user_bucket":
            high = np.array(int(contract["user_buckets"]))
        elif source == "feature":
            high = np.array(feature_rows.get(spec.get("feature"), 1))
        else:  # one column per table, last but one dimension for sequences
            high = np.array([rows[c] for c in spec["columns"]])
            if len(shape) == 3:
                high = high[:, None]
        feed[spec["name"]] = (rng.random(shape) * high).astype(np.int64)
    return feed
