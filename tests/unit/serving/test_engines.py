"""The engines: an export holds its graph as ONNX too, ONNX Runtime scores as Paddle does, and
serving falls back to Paddle (one warning) when ONNX cannot be used; oneDNN off changes no score.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from streamrec.config import ServingConfig
from streamrec.errors import InvalidSnapshot
from streamrec.learner.columns import SampleColumns
from streamrec.serving import engines, onnxfile
from streamrec.serving import export as export_module
from streamrec.serving.export import write_export
from streamrec.serving.scorer import Candidate, ExportedModel
from streamrec.snapshots.exports import verify_export
from tests.unit.serving.test_export import DEFAULT_LAYOUT, config, stream, trained

pytest.importorskip("onnxruntime")
pytest.importorskip("paddle2onnx")

TOLERANCE = 1e-5
REQUESTS = [
    ("u3", [("i1", "c1"), ("i2", "c2"), ("i59", "c3")], ["i1:c1", "i3:c3", "never-seen:c0", "i4"]),
    ("u-new", [], ["i1:c1", "i2:c2"]),
    ("u7", [(f"i{k}", f"c{k % 7}") for k in range(40)], [f"i{k}:c{k % 7}" for k in range(100)]),
]


def _export(tmp_path: Path, model: str = "din", **fields: Any) -> Path:
    learner = trained(config(**fields), model)
    return write_export(learner, tmp_path / "v000001", 1, learner.cfg.learner)


def _contract(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = orjson.loads((path / "contract.json").read_bytes())
    return doc


@pytest.mark.parametrize(
    "fields",
    [{}, {"tables": DEFAULT_LAYOUT}, {"id_stats": False, "wide": False}],
    ids=["dynamic", "default-layout", "plain-din"],
)
@pytest.mark.parametrize("model", ["din", "deepfm"])
def test_onnx_runtime_scores_as_paddle(tmp_path: Path, model: str, fields: dict[str, Any]) -> None:
    path = _export(tmp_path, model, **fields)
    onnx, paddle = ExportedModel(path, engine="onnx"), ExportedModel(path, engine="paddle")
    assert (onnx.engine, paddle.engine) == ("onnx", "paddle")
    for user, history, items in REQUESTS:
        candidates = [Candidate.parse(i) for i in items]
        got, want = onnx.score(user, history, candidates), paddle.score(user, history, candidates)
        assert got.dtype == np.float32 and got.shape == (len(items),)
        assert np.abs(got - want).max() <= TOLERANCE
    batch = stream(500, 99, 90_000)
    assert np.abs(onnx.score_batch(batch) - paddle.score_batch(batch)).max() <= TOLERANCE


def test_the_export_holds_the_onnx_graph_under_its_checksums(tmp_path: Path) -> None:
    path = _export(tmp_path)
    assert "model.onnx" in verify_export(path)
    entry = _contract(path)["onnx"]
    assert entry["file"] == "model.onnx" and entry["opset"] == onnxfile.OPSET
    assert entry["converter"].startswith("paddle2onnx ")
    import onnx
    from onnx import numpy_helper

    constants = [
        n.attribute[0].t for n in onnx.load(path / "model.onnx").graph.node if n.op_type == "Constant"
    ]
    values = {(t.data_type, tuple(t.dims), numpy_helper.to_array(t).tobytes()) for t in constants}
    assert len(values) == len(constants)
    assert ExportedModel(path).engine == "onnx"  # auto picks it


def test_repeated_constants_are_kept_once() -> None:
    import onnx
    import onnxruntime
    from onnx import helper, numpy_helper

    weights = np.arange(6, dtype=np.float32).reshape(2, 3)

    def constant(name: str, value: np.ndarray) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name))

    graph = helper.make_graph(
        [
            constant("a", weights),
            constant("b", weights),
            constant("c", weights + 1),
            helper.make_node("Add", ["x", "a"], ["xa"]),
            helper.make_node("Add", ["xa", "b"], ["xab"]),
            helper.make_node("Add", ["xab", "c"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])],
    )
    raw = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    deduped = onnxfile.dedupe_constants(raw)
    constants = [n for n in onnx.load_model_from_string(deduped).graph.node if n.op_type == "Constant"]
    assert [n.output[0] for n in constants] == ["a", "c"]
    x = np.ones((2, 3), np.float32)
    (got,) = onnxruntime.InferenceSession(deduped).run(None, {"x": x})
    assert np.array_equal(got, x + 3 * weights + 1)


def test_declared_features_convert_and_score_alike(tmp_path: Path) -> None:
    from tests.unit.learner.test_features import featured
    from tests.unit.serving.test_feature_inputs import _export as featured_export

    path = featured_export(tmp_path)
    assert "onnx" in _contract(path)
    batch = SampleColumns.from_samples(featured(64))
    onnx, paddle = ExportedModel(path, engine="onnx"), ExportedModel(path, engine="paddle")
    assert np.abs(onnx.score_batch(batch) - paddle.score_batch(batch)).max() <= TOLERANCE


def _without_onnx(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(export_module, "write_onnx", lambda directory, contract, source=None: None)


def test_onnx_asked_for_on_an_export_without_it_falls_back_to_paddle_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _without_onnx(monkeypatch)  # an export written before the ONNX graph, or without the extra
    path = _export(tmp_path)
    assert "onnx" not in _contract(path) and not (path / "model.onnx").exists()
    with caplog.at_level(logging.INFO, logger="streamrec"):
        model = ExportedModel(path, engine="onnx")
    assert model.engine == "paddle"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "no ONNX graph" in warnings[0].getMessage()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="streamrec"):
        assert ExportedModel(path).engine == "paddle"  # auto: no warning, nothing was asked
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_auto_runs_paddle_without_onnxruntime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _export(tmp_path)
    monkeypatch.setattr(engines, "onnxruntime_available", lambda: False)
    assert ExportedModel(path).engine == "paddle"
    assert ExportedModel(path, engine="paddle").engine == "paddle"


def test_an_onnx_graph_onnxruntime_cannot_load_falls_back(tmp_path: Path) -> None:
    path = _export(tmp_path)
    (path / "model.onnx").chmod(0o644)
    (path / "model.onnx").write_bytes(b"not a model")
    with pytest.raises(InvalidSnapshot, match="model.onnx"):
        ExportedModel(path)  # the checksums catch it first
    with pytest.raises(InvalidSnapshot, match="onnxruntime cannot load"):
        engines.OnnxEngine(path / "model.onnx")
    model = engines.open_engine(path, _contract(path), "onnx")
    assert model.name == "paddle"


@pytest.mark.parametrize("failure", ["conversion", "parity"])
def test_a_failed_conversion_leaves_the_export_whole_without_onnx(
    tmp_path: Path, failure: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def fail(directory: Path) -> bytes:
        raise RuntimeError("unsupported operator")

    if failure == "conversion":
        monkeypatch.setattr(onnxfile, "_convert", fail)
    else:
        monkeypatch.setattr(onnxfile, "_parity_gap", lambda directory, model, contract: 0.5)
    with caplog.at_level(logging.WARNING, logger="streamrec"):
        path = _export(tmp_path)
    assert "model.onnx" not in verify_export(path) and not (path / "model.onnx").exists()
    assert "onnx" not in _contract(path)
    assert len(caplog.records) == 1 and "export without model.onnx" in caplog.records[0].getMessage()
    assert ExportedModel(path).engine == "paddle"


def test_paddle_without_onednn_scores_as_with_it(tmp_path: Path) -> None:
    """Paddle runs with oneDNN off, for speed (docs/serving.md, "Engines"); no score moves."""
    from paddle import inference

    path = _export(tmp_path, tables=DEFAULT_LAYOUT)
    reference = inference.Config(str(path / "model.json"), str(path / "model.pdiparams"))
    reference.disable_gpu()
    reference.enable_mkldnn()
    reference.disable_glog_info()
    predictor = inference.create_predictor(reference)
    model = ExportedModel(path, engine="paddle")
    feed = onnxfile.probe_inputs(_contract(path), np.random.default_rng(1))
    for name in predictor.get_input_names():
        handle = predictor.get_input_handle(name)
        handle.reshape(feed[name].shape)
        handle.copy_from_cpu(feed[name])
    predictor.run()
    want = predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()
    assert np.abs(model._run(feed) - want).max() <= 1e-6


def test_the_engine_setting() -> None:
    assert ServingConfig().engine == "auto"
    assert ServingConfig(engine="paddle").engine == "paddle"
    with pytest.raises(ValueError, match="engine"):
        ServingConfig.model_validate({"engine": "tensorrt"})


def test_an_export_prints_nothing_paddle_says_goes_to_the_debug_log(tmp_path: Path) -> None:
    # paddle2onnx's C++ side prints its progress on the process's standard output, which would
    # break a command's JSON there (`streamrec snapshot ...`), and Paddle's tracing warned, at
    # every export, that a traced tensor has no place (its own ones_like reads it): a learner's
    # log held 9 lines of Paddle's at each export, and the demo's output too.
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from streamrec.paddlesignals import before_paddle\n"
        "before_paddle()\n"  # as every streamrec command does
        "from streamrec.config import ModelConfig\n"
        "from streamrec.learner.din import DINLearner\n"
        "from streamrec.serving.export import write_export\n"
        "learner = DINLearner(ModelConfig(device='cpu'))\n"
        "write_export(learner, Path(sys.argv[1]), 1)\n"
        "write_export(learner, Path(sys.argv[2]), 2)\n"
        "print('only this')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "v000001"), str(tmp_path / "v000002")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert (tmp_path / "v000002" / onnxfile.ONNX_FILE).exists()
    assert done.stdout == "only this\n"
    assert "Paddle2ONNX" not in done.stderr
    assert "Warning" not in done.stderr, done.stderr
    # Left: Paddle's C++ warns once a process, at its first trace, that a static graph takes no
    # `out` tensor: its own divide (`a / b`), clip and eye pass one, so no rewrite of ours avoids it.
    assert len(done.stderr.splitlines()) <= 1, done.stderr


def test_paddle2onnxs_lines_are_kept_for_the_log_and_the_rest_goes_on_out(
    capfd: pytest.CaptureFixture[str],
) -> None:
    import ctypes

    libc = ctypes.CDLL(None)
    said: list[str] = []
    with onnxfile.native_stdout_kept(said):
        libc.printf(b"[Paddle2ONNX] one\nanother thread's line\n[Paddle2ONNX] two\n")
    assert said == ["[Paddle2ONNX] one", "[Paddle2ONNX] two"]
    assert capfd.readouterr().out == "another thread's line\n"


def test_the_onnx_graph_is_traced_in_onnx_runtimes_forms(tmp_path: Path) -> None:
    import onnx

    path = _export(tmp_path, tables=DEFAULT_LAYOUT)

    def ops(model: onnx.ModelProto) -> list[str]:
        return sorted(n.op_type for n in model.graph.node)

    served = onnx.load(path / "model.onnx")
    paddle_graph = onnx.load_model_from_string(onnxfile._convert(path))  # model.json, as converted before
    assert ops(served) != ops(paddle_graph)
    # Each MLP's last product is a row, w^T x^T: its activations reach a MatMul through a Transpose.
    transposed = {n.output[0] for n in served.graph.node if n.op_type == "Transpose"}
    assert sum(1 for n in served.graph.node if n.op_type == "MatMul" and n.input[1] in transposed) >= 4
