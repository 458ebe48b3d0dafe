"""The export: Paddle Inference reproduces the training model's scores, in this process and in
one that imports no streamrec (``examples/score_export.py``, on Paddle or on ONNX Runtime
without Paddle); its files are world-readable and checked.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamrec.config import ModelConfig
from streamrec.errors import InvalidSnapshot
from streamrec.learner.columns import SampleColumns
from streamrec.learner.deepfm_learner import DeepFMLearner
from streamrec.learner.din import DINLearner
from streamrec.learner.snapshotting import group_state
from streamrec.learner.trainer import TableLearner
from streamrec.samples import Sample
from streamrec.serving.export import export_snapshot, verify_export, write_export
from streamrec.serving.scorer import Candidate, ExportedModel
from streamrec.snapshots.store import SnapshotStore
from tests.support import small_tables

EXAMPLE = Path(__file__).parents[3] / "examples" / "score_export.py"
TOLERANCE = 1e-5
HAS_ONNX = all(importlib.util.find_spec(m) for m in ("onnxruntime", "paddle2onnx"))
# The example's engines: ONNX Runtime's needs the ONNX graph in the export (paddle2onnx) and onnxruntime.
ENGINES = ["paddle", pytest.param("onnx", marks=pytest.mark.skipif(not HAS_ONNX, reason="no onnx extra"))]


# The default tables' kinds (ModelConfig.tables), small: a dynamic item table, a hashed category one.
DEFAULT_LAYOUT = [{**small_tables(512, 64, dim=4)[0]}, {**small_tables(512, 64, dim=4)[1], "ids": "hashed"}]


def config(**fields: Any) -> ModelConfig:
    return ModelConfig.model_validate({
        "tables": small_tables(512, 64, dim=4), "sequence_length": 6, "attention_units": (8,),
        "mlp_units": (8,), "train_batch_size": 32, "device": "cpu", "learning_rate": 0.01, **fields,
    })


def stream(n: int, seed: int, ts: int) -> SampleColumns:
    """Clicks of 20 users over 60 items (category = item mod 7), histories from earlier clicks."""
    rng = np.random.default_rng(seed)
    histories: dict[str, list[tuple[str, str]]] = {}
    samples = []
    for k in range(n):
        user, item = f"u{rng.integers(20)}", int(rng.zipf(1.5)) % 60
        history = histories.setdefault(user, [])
        samples.append(Sample(
            f"s{seed}-{k}", user, ts + k, f"i{item}", f"c{item % 7}",
            int(rng.random() < 0.3 + item % 3 * 0.2),
            tuple(h[0] for h in history[-6:]), tuple(h[1] for h in history[-6:]),
        ))
        history.append((f"i{item}", f"c{item % 7}"))
    return SampleColumns.from_samples(samples)


def request_batch(
    user: str, history: list[tuple[str, str]], candidates: list[tuple[str, str | None]]
) -> SampleColumns:
    """The samples a request scores: each candidate after the same history (no category: "")."""
    return SampleColumns.from_samples([
        Sample(f"q{k}", user, 10**6, item, category or "", 0, tuple(h[0] for h in history),
               tuple(h[1] for h in history))
        for k, (item, category) in enumerate(candidates)
    ])


def trained(cfg: ModelConfig, model: str = "din") -> TableLearner:
    learner: TableLearner = DINLearner(cfg)
    if model == "deepfm":
        learner = DeepFMLearner(cfg.model_copy(update={"learner": "deepfm"}))
    for k in range(3):
        learner.learn_many(stream(600, k, k * 10_000))
    return learner


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"tables": small_tables(512, 64, dim=4, ids="hashed")},
        {"tables": [*small_tables(512, 64, dim=4),
                    {"name": "user", "feature": "user", "rows": 64, "dim": 4}]},
        {"id_stats": False, "wide": False},
        {"match_features": False},
        {"tables": DEFAULT_LAYOUT},
    ],
    ids=["dynamic", "hashed", "user-table", "plain-din", "no-match-features", "default-layout"],
)
@pytest.mark.parametrize("model", ["din", "deepfm"])
def test_the_export_scores_as_the_training_model(tmp_path: Path, fields: dict[str, Any], model: str) -> None:
    learner = trained(config(**fields), model)
    match = getattr(learner.model, "match", None)
    if match is not None:  # the match features weigh in, so the export must compute them
        assert np.abs(match.weight.numpy()).max() > 0.01
    batch = stream(500, 99, 90_000)  # unseen ids among them read the default rows
    export = write_export(learner, tmp_path / "v000001", 1, learner.cfg.learner)
    got = ExportedModel(export).score_batch(batch)
    assert np.abs(got - learner.predict_many(batch)).max() <= TOLERANCE


def test_a_snapshot_from_before_the_match_features_still_exports(tmp_path: Path) -> None:
    """Its manifest's model configuration has no ``match_features``: it was trained without."""
    cfg = config(match_features=False)
    learner = trained(cfg)
    model_doc = cfg.model_dump(mode="json")
    del model_doc["match_features"], model_doc["match_lr_scale"]
    store = SnapshotStore(tmp_path)
    manifest = store.write(
        group_state(learner.state_arrays()), micro_batches=3, samples_trained=0, positions=(),
        config={"model": model_doc},
    )
    batch = stream(200, 99, 90_000)
    got = ExportedModel(export_snapshot(store, manifest.version)).score_batch(batch)
    assert np.abs(got - learner.predict_many(batch)).max() <= TOLERANCE


@pytest.mark.parametrize(
    "tables", [small_tables(512, 64, dim=4), DEFAULT_LAYOUT], ids=["dynamic", "default-layout"]
)
@pytest.mark.parametrize("model", ["din", "deepfm"])
@pytest.mark.parametrize("engine", ENGINES)
def test_a_process_without_streamrec_scores_as_the_training_model(
    tmp_path: Path, tables: list[dict[str, Any]], model: str, engine: str
) -> None:
    learner = trained(config(tables=tables), model)
    export = write_export(learner, tmp_path / "v000001", 1, learner.cfg.learner)
    history = [("i1", "c1"), ("i2", "c2"), ("i1", "c1"), ("i59", "c3")]
    candidates = [("i1", "c1"), ("i3", "c3"), ("never-seen", "c0"), ("i4", None)]
    want = learner.predict_many(request_batch("u3", history, candidates))
    script = (
        f"e = score_export.Export(score_export.Path({str(export)!r}), {engine!r})\n"
        f"assert e.engine == {engine!r}, e.engine\n"
        f"scores = e.score('u3', {history!r}, {candidates!r})\n"
        "assert not [m for m in sys.modules if m.startswith('streamrec')], 'imported streamrec'\n"
        # ONNX Runtime's needs no Paddle: a service may install onnxruntime alone
        f"assert {engine!r} == 'paddle' or 'paddle' not in sys.modules, 'imported paddle'\n"
        "print(json.dumps([float(s) for s in scores]))\n"
    )
    got = np.array(run_outside(script, tmp_path))
    # The category-less candidate: the learner read "" (a dynamic table's default row), the
    # export None, which is that row in a dynamic table but padding in a hashed one, where ""
    # hashes to a row of its own (events always carry a category: training never reads None).
    alike = len(candidates) if tables[1].get("ids", "dynamic") == "dynamic" else len(candidates) - 1
    assert np.abs(got - want)[:alike].max() <= TOLERANCE
    assert 0 < got[-1] < 1


def run_outside(script: str, cwd: Path) -> Any:
    """Run ``script`` in a process of its own that imports the example; its last line, as JSON."""
    preamble = f"import json, sys\nsys.path.insert(0, {str(EXAMPLE.parent)!r})\nimport score_export\n"
    proc = subprocess.run(
        [sys.executable, "-c", preamble + script], capture_output=True, text=True, timeout=120,
        cwd=cwd, env={**os.environ, "PYTHONPATH": ""},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_example(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": ""},
    )


@pytest.mark.skipif(not HAS_ONNX, reason="no onnx extra")
def test_the_example_chooses_its_engine_from_the_contract_or_the_flag(tmp_path: Path) -> None:
    export = write_export(trained(config()), tmp_path / "v000001", 1)
    args = [str(export), "u3", "i1:c1", "i3:c3", "never-seen", "--history", "i1:c1,i2:c2"]
    runs = {engine: run_example(*args, "--engine", engine) for engine in ("auto", "onnx", "paddle")}
    assert all(run.returncode == 0 for run in runs.values()), {e: r.stderr[-1000:] for e, r in runs.items()}
    scores = {engine: json.loads(run.stdout) for engine, run in runs.items()}
    assert scores["auto"] == scores["onnx"]  # auto: ONNX Runtime when the contract names the graph
    assert scores["onnx"].keys() == scores["paddle"].keys()
    assert max(abs(scores["onnx"][k] - scores["paddle"][k]) for k in scores["onnx"]) <= TOLERANCE
    # An export whose contract names no ONNX graph (written before it, or without paddle2onnx)
    contract = json.loads((export / "contract.json").read_text())
    del contract["onnx"]
    (export / "contract.json").write_text(json.dumps(contract))
    auto = run_example(*args)
    assert auto.returncode == 0 and json.loads(auto.stdout) == scores["paddle"], auto.stderr[-1000:]
    asked = run_example(*args, "--engine", "onnx")
    assert asked.returncode == 2 and "Traceback" not in asked.stderr
    assert asked.stderr.strip().splitlines()[-1] == (
        f"score_export.py: error: {export} has no ONNX graph (its contract.json names none); "
        "--engine paddle or auto scores it with Paddle"
    )


def test_the_scorer_api_matches_the_example(tmp_path: Path) -> None:
    learner = trained(config())
    model = ExportedModel(write_export(learner, tmp_path / "v000001", 1))
    history = [("i1", "c1"), ("i5", "c5")]
    batch = SampleColumns.from_samples([
        Sample(f"q{k}", "u1", 10**6, item, f"c{k}", 0, ("i1", "i5"), ("c1", "c5"))
        for k, item in enumerate(["i1", "i2", "zz"])
    ])
    got = model.score("u1", history, [Candidate("i1", "c0"), Candidate("i2", "c1"), Candidate("zz", "c2")])
    assert np.abs(got - learner.predict_many(batch)).max() <= TOLERANCE


def test_export_files_are_world_readable_and_verified(tmp_path: Path) -> None:
    export = write_export(trained(config()), tmp_path / "v000001", 1)
    for path in [export, *export.rglob("*")]:
        mode = path.stat().st_mode & 0o777
        assert mode == (0o755 if path.is_dir() else 0o644), path
    files = verify_export(export)
    assert {"model.json", "model.pdiparams", "contract.json", "ids/item.keys.npy"} <= set(files)
    contract = json.loads((export / "contract.json").read_text())
    assert [i["name"] for i in contract["inputs"]] == ["targets", "sequences", "users"]
    with (export / "ids" / "item.rows.npy").open("r+b") as fh:
        fh.seek(-1, os.SEEK_END)
        fh.write(b"\x07")
    with pytest.raises(InvalidSnapshot, match=r"ids/item\.rows\.npy does not match"):
        ExportedModel(export)
    assert not list(tmp_path.glob(".tmp-*"))


def contract_with(inputs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"schema": 1, "tables": [{"name": "item"}, {"name": "category"}], "inputs": inputs}


def test_serving_builds_the_inputs_a_contract_declares_and_reads_old_ones_by_name() -> None:
    from streamrec.serving.contract import servable_inputs

    declared: list[dict[str, Any]] = [
        {"name": "rows", "source": "target_rows", "columns": ["category"], "dtype": "int64"},
        {"name": "users", "dtype": "int64"},  # written before inputs stated their source
    ]
    got = servable_inputs(contract_with(declared), Path("v000001"))
    assert [(i["name"], i["source"]) for i in got] == [("rows", "target_rows"), ("users", "user_bucket")]


@pytest.mark.parametrize(
    ("spec", "why"),
    [({"name": "price", "source": "price_bucket"}, "built from 'price_bucket'"),
     ({"name": "targets", "source": "target_rows", "columns": ["shop"]}, "reads tables it does not list"),
     ({"name": "anything"}, "built from None")],
)
def test_an_input_serving_cannot_build_is_refused_in_one_line(spec: dict[str, Any], why: str) -> None:
    from streamrec.errors import NotServable
    from streamrec.serving.contract import servable_inputs

    with pytest.raises(NotServable, match=why) as info:
        servable_inputs(contract_with([{**spec, "dtype": "int64"}]), Path("v000001"))
    assert "\n" not in str(info.value) and "contract.json" in str(info.value)


def test_the_scorer_refuses_what_is_not_its_input_naming_it(tmp_path: Path) -> None:
    # Found by the Python-API tour: candidates as ids raised AttributeError "'str' object has no
    # attribute 'target_id'", samples as a list "'list' object has no attribute 'target_ids'", and
    # a history of item ids, not (item, category) pairs, was scored: "i2" read as item "i", category "2".
    learner = trained(config())
    model = ExportedModel(write_export(learner, tmp_path / "v000001", 1))
    with pytest.raises(TypeError, match=r"candidates are Candidate values .*, not 'i1'"):
        model.score("u1", [("i2", "c1")], ["i1"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"history holds \(item, category\) pairs, not 'i2'"):
        model.score("u1", ["i2"], [Candidate("i1")])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"SampleColumns\.from_samples\(samples\)\), not list"):
        model.score_batch([Sample("e1", "u1", 1, "i1", "c1", 1, (), ())])  # type: ignore[arg-type]


def test_the_scorer_refuses_ids_that_are_not_strings_naming_them(tmp_path: Path) -> None:
    # Found by the Python-API tour: MovieLens's ids are numbers, and Candidate(5) or a user id of
    # None reached the id hash: TypeError "descriptor 'encode' for 'str' objects doesn't apply to a
    # 'int' object", naming neither the candidate nor the user.
    model = ExportedModel(write_export(trained(config()), tmp_path / "v000001", 1))
    with pytest.raises(TypeError, match=r"a candidate's item_id is a str, not 5 \(int\)"):
        model.score("u1", [], [Candidate("i1"), Candidate(5)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"a candidate's category_id is a str or None, not 7 \(int\)"):
        model.score("u1", [], [Candidate("i1", 7)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"user_id is a str, not None"):
        model.score(None, [], [Candidate("i1")])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"history holds \(item, category\) pairs of str, not \(1, 'c1'\)"):
        model.score("u1", [(1, "c1")], [Candidate("i1")])  # type: ignore[list-item]


def test_a_loaded_export_and_a_scorer_say_what_they_serve_in_their_repr(tmp_path: Path) -> None:
    # Found by the Python-API tour: a notebook showed "<streamrec.serving.scorer.ExportedModel
    # object at 0x7f...>", saying neither the version, the path nor the engine.
    from streamrec.serving.scorer import Scorer

    store = SnapshotStore(tmp_path)
    learner = trained(config())
    store.write(
        group_state(learner.state_arrays()), micro_batches=1, samples_trained=0, positions=(),
        config={"model": learner.cfg.model_dump(mode="json"), "features": learner.schema.to_json()},
    )
    store.promote(1)
    model = ExportedModel(export_snapshot(store, 1))
    assert repr(model) == f"ExportedModel(version=1, engine={model.engine!r}, path={str(model.path)!r})"
    scorer = Scorer(tmp_path)
    assert repr(scorer) == f"Scorer(root={str(tmp_path)!r}, version=1, current=1, load_failures=0)"


def test_an_export_path_that_is_no_export_is_named_as_such(tmp_path: Path) -> None:
    # Found by the Python-API tour: a mistyped path read "manifest.json is missing or unreadable:
    # rebuild it with `streamrec snapshot export VERSION --rebuild`", and a snapshot's own directory
    # (not its export) "contract.json cannot be served from (FileNotFoundError: ...)": both sent the
    # user to rebuild an export that was never asked for.
    learner = trained(config())
    store = SnapshotStore(tmp_path)
    store.write(
        group_state(learner.state_arrays()), micro_batches=1, samples_trained=0, positions=(),
        config={"model": learner.cfg.model_dump(mode="json"), "features": learner.schema.to_json()},
    )
    with pytest.raises(InvalidSnapshot, match=r"^no export directory .*nope: give an export's directory"):
        ExportedModel(tmp_path / "nope")
    with pytest.raises(InvalidSnapshot, match=r"v000001 is snapshot version 1, not its export: export_snap"):
        ExportedModel(store.path(1))
