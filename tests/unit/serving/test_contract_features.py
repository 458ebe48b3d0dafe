"""``contract.json`` lists every feature the model reads, the built-ins (item, category, the user
id) as the declared ones, so an outside scorer is written from the contract alone; exports of
the contract's schema 1 (declared features only) are still served and scored by the example.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from streamrec.serving.export import write_export
from streamrec.serving.scorer import ExportedModel
from tests.unit.serving.test_export import TOLERANCE, config, request_batch, run_outside, stream, trained
from tests.unit.serving.test_feature_inputs import _export

pytest.importorskip("paddle")

# What every feature's entry states (a declared id or a built-in id alike); with a table, its
# rows and how an id becomes a row.
ENTRY = {"name", "field", "kind", "role", "outcome", "table", "transform", "inputs", "builtin"}
TABLED = {*ENTRY, "rows", "row_of_id"}


def contract_of(export: Path) -> dict[str, Any]:
    doc: dict[str, Any] = orjson.loads((export / "contract.json").read_bytes())
    return doc


def test_the_default_schemas_contract_lists_item_category_and_the_user_as_builtins(tmp_path: Path) -> None:
    export = write_export(trained(config()), tmp_path / "v000001", 1)
    contract = contract_of(export)
    assert contract["schema"] == 2
    features = {f["name"]: f for f in contract["features"]}
    assert list(features) == ["item", "category", "user"]
    assert all(f["builtin"] for f in features.values())
    item, category, user = features["item"], features["category"], features["user"]
    assert set(item) == set(category) == TABLED and set(user) == ENTRY
    assert (item["field"], item["kind"], item["role"]) == ("item_id", "id", "behaviour")
    assert item["table"] == "item"
    assert (category["field"], category["table"]) == ("category_id", "category")
    assert item["inputs"] == category["inputs"] == ["targets", "sequences"]
    tables = {t["name"]: t for t in contract["tables"]}
    assert item["rows"] == tables["item"]["rows"] and item["row_of_id"] == tables["item"]["row_of_id"]
    # The user id (the request's user): its statistics bucket always, a row of its own only
    # with a user table.
    assert (user["field"], user["role"], user["table"]) == ("user_id", "user", None)
    assert user["inputs"] == ["users"]


def test_builtins_are_listed_beside_declared_features_with_the_same_fields(tmp_path: Path) -> None:
    contract = contract_of(_export(tmp_path))
    features = {f["name"]: f for f in contract["features"]}
    assert list(features)[:3] == ["item", "category", "user"]  # the built-ins first, then the declared
    declared = {f["name"] for f in contract["feature_schema"][2:]}
    assert {n for n, f in features.items() if not f["builtin"]} == declared == set(list(features)[3:])
    device = features["device"]  # a declared id with a table of its own
    assert device["kind"] == "id" and not device["builtin"] and set(device) == TABLED
    assert set(features["item"]) == set(features["user"]) == set(device)
    assert features["user"]["table"] == "user" and features["user"]["inputs"] == ["users", "context"]
    assert features["genres"]["field"] == "genres"


# -- exports written before: contract schema 1 ------------------------------------------------


def as_schema_1(export: Path, sources: bool = True) -> None:
    """Rewrite ``export``'s contract as schema 1 wrote it (declared features only, no ``field``
    nor ``builtin``; no ``features`` at all under the default schema), and seal it again.

    ``sources`` False: as the releases before 2026-12-02 wrote it (7ae6374, say), its inputs
    stating no ``source`` either.
    """
    from streamrec.serving.export import _seal

    doc = contract_of(export)
    old = ("field", "builtin")
    declared = [{k: v for k, v in f.items() if k not in old} for f in doc["features"] if not f["builtin"]]
    doc = {**doc, "schema": 1, "features": declared}
    if not sources:
        doc["inputs"] = [{k: v for k, v in spec.items() if k != "source"} for spec in doc["inputs"]]
    if not declared:
        del doc["features"]
    (export / "contract.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    for name in ("manifest.json", "manifest.sha256"):
        (export / name).unlink()
    _seal(export, doc["version"])


def test_a_schema_1_export_is_served_and_scored_by_the_example(tmp_path: Path) -> None:
    learner = trained(config())
    export = write_export(learner, tmp_path / "v000001", 1)
    batch = stream(300, 99, 90_000)
    new = ExportedModel(export).score_batch(batch)
    as_schema_1(export)
    assert "features" not in contract_of(export)
    assert np.abs(ExportedModel(export).score_batch(batch) - new).max() <= TOLERANCE
    history = [("i1", "c1"), ("i2", "c2"), ("i59", "c3")]
    candidates: list[tuple[str, str | None]] = [("i1", "c1"), ("i3", "c3"), ("never-seen", "c0")]
    want = learner.predict_many(request_batch("u3", history, candidates))
    script = (
        f"e = score_export.Export(score_export.Path({str(export)!r}), 'paddle')\n"
        "assert e.pair == (('item', 'item_id'), ('category', 'category_id')), e.pair\n"
        f"print(json.dumps([float(s) for s in e.score('u3', {history!r}, {candidates!r})]))\n"
    )
    got = np.array(run_outside(script, tmp_path))
    assert np.abs(got - want).max() <= TOLERANCE


def test_a_schema_1_export_with_declared_features_is_served(tmp_path: Path) -> None:
    from streamrec.serving.scorer import Candidate

    export = _export(tmp_path)
    candidates = [Candidate("i1", "c1", {"genres": ["a"], "price": 3.0}), Candidate("zz", "c2")]
    new = ExportedModel(export).score("u1", [("i8", "c1")], candidates, {"device": "ios"})
    as_schema_1(export)
    names = {f["name"] for f in contract_of(export)["features"]}
    assert names == {"genres", "rating", "device", "age", "price"}
    old = ExportedModel(export).score("u1", [("i8", "c1")], candidates, {"device": "ios"})
    assert np.abs(old - new).max() <= TOLERANCE


@pytest.mark.parametrize("declared", [False, True], ids=["default schema", "declared features"])
def test_an_export_whose_inputs_state_no_source_loads_scores_and_verifies(
    tmp_path: Path, declared: bool
) -> None:
    """Exports of the releases before 2026-12-02 (inputs without ``source``): the probe batch run at
    each load (5b8b13c) read an input's source from the raw contract, and failed on the user
    bucket (``KeyError: 'columns'``), so ``streamrec serve``, ``score``, ``snapshot verify`` and
    the gate refused every such export. Found by the upgrades tour on 7ae6374's exports.
    """
    from streamrec.serving.loading import read_export
    from streamrec.serving.probe import graphs_problem
    from streamrec.serving.scorer import Candidate

    export = _export(tmp_path) if declared else write_export(trained(config()), tmp_path / "v000001", 1)
    candidates = [Candidate("i1", "c1", {"genres": ["a"], "price": 3.0}), Candidate("zz", "c2")]
    context = {"device": "ios"} if declared else {}
    new = ExportedModel(export).score("u1", [("i8", "c1")], candidates, context)
    as_schema_1(export, sources=False)
    assert not any("source" in spec for spec in contract_of(export)["inputs"])
    old = ExportedModel(export).score("u1", [("i8", "c1")], candidates, context)
    assert np.abs(old - new).max() <= TOLERANCE
    assert graphs_problem(read_export(export)) is None


def test_an_input_reading_a_builtin_as_a_declared_feature_is_refused(tmp_path: Path) -> None:
    from streamrec.errors import NotServable
    from streamrec.serving.contract import servable_inputs

    export = write_export(trained(config()), tmp_path / "v000001", 1)
    contract = contract_of(export)
    bad = {**contract, "inputs": [*contract["inputs"], {
        "name": "item__target", "source": "feature", "feature": "item", "side": "target",
        "dtype": "int64", "shape": [-1],
    }]}
    with pytest.raises(NotServable, match="feature 'item'"):
        servable_inputs(bad, export)
