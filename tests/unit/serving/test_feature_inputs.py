"""Declared features in a table model's export: inputs of source ``feature``, built from the contract.

The contract-driven scorer and ``examples/score_export.py`` (no streamrec, on Paddle or ONNX Runtime)
build them alike, for a DIN's export and a DeepFM's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from streamrec.learner.columns import SampleColumns
from streamrec.learner.registry import make_learner
from tests.unit.learner.test_features import SCHEMA, featured, model
from tests.unit.serving.test_export import ENGINES

pytest.importorskip("paddle")

EXAMPLE = Path(__file__).parents[3] / "examples" / "score_export.py"


def _export(tmp_path: Path, learner_type: str = "din") -> Path:
    from streamrec.learner.snapshotting import group_state
    from streamrec.learner.trainer import TableLearner
    from streamrec.serving.export import export_snapshot
    from streamrec.snapshots.store import SnapshotStore

    tables = [*model().model_dump()["tables"], {"name": "user", "feature": "user", "rows": 64, "dim": 4}]
    learner = make_learner(model(tables=tables, learner=learner_type), SCHEMA)
    assert isinstance(learner, TableLearner) and learner.plan.input_keys  # DIN and DeepFM read them
    for _ in range(3):
        learner.learn_many(SampleColumns.from_samples(featured(32)))
    store = SnapshotStore(tmp_path / "snapshots")
    manifest = store.write(
        group_state(learner.state_arrays()), micro_batches=1, samples_trained=0, positions=(),
        config={"model": learner.cfg.model_dump(mode="json"), "features": SCHEMA.to_json()},
    )
    return export_snapshot(store, manifest.version)


@pytest.mark.parametrize("learner_type", ["din", "deepfm"])
@pytest.mark.parametrize("engine", ENGINES)
def test_feature_inputs_state_their_source_and_an_outside_scorer_builds_them(
    tmp_path: Path, learner_type: str, engine: str
) -> None:
    from streamrec.serving.features import StoredHistory
    from streamrec.serving.scorer import Candidate, ExportedModel

    export = _export(tmp_path, learner_type)
    contract = orjson.loads((export / "contract.json").read_bytes())
    assert contract["model"]["learner"] == learner_type
    features = [i for i in contract["inputs"] if i["source"] == "feature"]
    assert [(i["name"], i["feature"], i["side"]) for i in features][:2] == [
        ("genres__target", "genres", "target"), ("price__target", "price", "target"),
    ]
    declared = [f for f in contract["features"] if not f["builtin"]]
    assert {i["name"] for i in features} == {n for f in declared for n in f["inputs"]}
    history = [("i8", "c1"), ("i9", "c2")]
    candidates = [("i1", "c1"), ("i2", "c2"), ("never-seen", "c0")]
    context = {"device": "ios"}
    users = {"age": 41.0}
    along: dict[str, list[Any]] = {"genres": [["a"], None], "rating": [4.0, None], "price": [None, 30.0]}
    items: list[dict[str, object]] = [{"genres": ["a", "b"], "price": 7.0}, {}, {"genres": ["zz"]}]
    # the history as POST /score's (and the example's --history) gives it
    given = [{"item_id": "i8", "category": "c1", "genres": ["a"], "rating": 4.0},
             {"item": "i9", "category_id": "c2", "price": 30.0}]
    exported = ExportedModel(export)
    stored = StoredHistory(history, {k: tuple(tuple(x) if isinstance(x, list) else x for x in v)
                                     for k, v in along.items()}, users)
    want = exported.score(
        "u1", stored, [Candidate(i, c, f) for (i, c), f in zip(candidates, items, strict=True)], context
    )
    absent = exported.score("u1", history, [Candidate(i, c) for i, c in candidates])
    assert not np.allclose(want, absent, atol=1e-4)  # the features matter
    assert ((want > 0.01) & (want < 0.99)).all(), want  # and the comparison is not of saturated scores
    script = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(EXAMPLE.parent)!r})\n"
        "import score_export\n"
        f"e = score_export.Export(score_export.Path({str(export)!r}), {engine!r})\n"
        f"assert e.engine == {engine!r}, e.engine\n"
        f"full = e.score('u1', {history!r}, {candidates!r}, {context!r}, {users!r}, {along!r}, {items!r})\n"
        f"bare = e.score('u1', {history!r}, {candidates!r})\n"
        f"given, given_along = score_export.behaviours({json.dumps(given)!r})\n"
        f"assert given == {history!r}, given\n"
        f"assert given_along == {along!r}, given_along\n"
        "assert score_export.behaviours('[[\"i8\", 5]]') == ([('i8', '5')], {})\n"
        "print(json.dumps([[float(s) for s in scores] for scores in (full, bare)]))\n"
        "assert not [m for m in sys.modules if m.startswith('streamrec')], 'imported streamrec'\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": ""},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    full, bare = json.loads(proc.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(full, want, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(bare, absent, rtol=1e-4, atol=1e-6)


def test_an_export_from_before_feature_sources_is_served_by_name(tmp_path: Path) -> None:
    from streamrec.serving.contract import servable_inputs

    export = _export(tmp_path)
    contract = orjson.loads((export / "contract.json").read_bytes())
    old = {**contract, "inputs": [
        {k: v for k, v in i.items() if k not in ("source", "feature", "side")} for i in contract["inputs"]
    ]}
    assert servable_inputs(old, export) == contract["inputs"]


def test_a_feature_input_of_an_unlisted_feature_is_refused_in_one_line(tmp_path: Path) -> None:
    from streamrec.errors import NotServable
    from streamrec.serving.contract import servable_inputs

    export = _export(tmp_path)
    contract = orjson.loads((export / "contract.json").read_bytes())
    bad = {**contract, "inputs": [*contract["inputs"], {**contract["inputs"][-1], "feature": "nope"}]}
    with pytest.raises(NotServable, match="feature 'nope'"):
        servable_inputs(bad, export)


def test_a_request_with_its_own_history_gives_the_user_s_features_as_the_profile_store_would(
    tmp_path: Path,
) -> None:
    """Found touring as a news site: a request that brings its own history (``serve --no-store``,
    the README's tour) had no way to give the user's declared features (a subscription tier), so
    every one read its default, a model trained with them served without them, and nothing said so.
    A request's ``user_features`` now stand where the profile store's newest values stand.
    """
    from streamrec.serving.features import StoredHistory
    from streamrec.serving.requests import parse_score_request
    from streamrec.serving.scorer import ExportedModel

    exported = ExportedModel(_export(tmp_path))
    doc: dict[str, object] = {
        "user": "u1", "items": [{"item_id": "i1", "category_id": "c1", "genres": ["a"]}, "i2:c2"],
        "history": [{"item_id": "i8", "category_id": "c1", "genres": ["a"], "rating": 4.0}, ["i9", "c2"]],
        "context": {"device": "ios"}, "user_features": {"age": 41.0},
    }
    user, candidates, history, context = parse_score_request(orjson.dumps(doc), 10)
    assert history is not None
    stored = StoredHistory(list(history), {"genres": (("a",), None), "rating": (4.0, None)}, {"age": 41.0})
    want = exported.score("u1", stored, candidates, context)
    np.testing.assert_allclose(exported.score(user, history, candidates, context), want, rtol=1e-6)
    bare = parse_score_request(orjson.dumps({k: v for k, v in doc.items() if k != "user_features"}), 10)
    assert bare[2] is not None
    without = exported.score(user, bare[2], candidates, context)
    assert not np.array_equal(without, want)  # the user's feature is read, not its default


def test_a_required_feature_the_request_is_the_source_of_is_refused_when_missing(tmp_path: Path) -> None:
    """Found touring as a news site: a context feature declared ``required`` (every training event
    had it, an event without it is dead-lettered) read its default when a request left it out,
    200 OK: the model scored a case it never trained on. The request is the only source of the
    context and of a candidate's own features, so one required there is refused, naming it.
    """
    from streamrec.errors import InvalidEvent
    from streamrec.serving.features import Candidate, feature_request_inputs

    contract = orjson.loads((_export(tmp_path) / "contract.json").read_bytes())
    declared = contract["feature_schema"]
    strict = {**contract, "feature_schema": [
        {**f, "required": f["required"] or f["name"] in ("device", "price")} for f in declared
    ]}
    priced = [Candidate("i1", "c1", {"price": 3.0})]
    assert feature_request_inputs(strict, "u1", priced, {"device": "ios"})
    with pytest.raises(InvalidEvent, match=r"'device' is required: give it in the request's 'context"):
        feature_request_inputs(strict, "u1", priced, None)
    with pytest.raises(InvalidEvent, match=r"'price' is required: give it with each item \(i2 has none\)"):
        feature_request_inputs(strict, "u1", [*priced, Candidate("i2", "c1")], {"device": "ios"})
    assert feature_request_inputs(contract, "u1", [Candidate("i2")], None)  # optional: defaults
