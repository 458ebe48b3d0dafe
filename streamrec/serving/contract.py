"""The scoring contract of a table model's export (``contract.json``), and its declared features' inputs.

The contract states everything a scorer outside streamrec needs: the inputs (their order,
names, shapes, dtypes and the ``source`` each is built from), the tables (how an id becomes a
row), the output, and ``features``: every feature the model reads, each with its name, the
event ``field`` it comes from, its kind, role, table, rows, how an id becomes a row and the
inputs it feeds. The built-ins (item and category, the default schema's, and the user id, as
`FeaturePlan` reads them) are listed first with ``builtin`` true, then the declared features
(``STREAMREC_FEATURES``) with ``builtin`` false, beside the schema they were declared in
(``feature_schema``).

Contract schema 2 lists the built-ins; schema 1 (exports written before) listed declared
features only, and no ``features`` at all under the default schema. Serving reads both
(`READABLE_SCHEMAS`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from streamrec.config import BEHAVIOUR_FEATURES, USER_FEATURE, ModelConfig, TableConfig
from streamrec.errors import NotServable
from streamrec.features import FeatureSchema
from streamrec.features.schema import BUILTIN
from streamrec.learner.columns import SampleColumns
from streamrec.learner.features import USER, FeaturePlan, Moments, encode_features
from streamrec.learner.hashing import PADDING_BUCKET
from streamrec.learner.idmap import DEFAULT_ROW
from streamrec.learner.idstats import USER_BUCKETS

if TYPE_CHECKING:
    from streamrec.learner.trainer import TableLearner

#: The contract's schema: 2 lists the built-in features under ``features``.
CONTRACT_SCHEMA = 2
#: The schemas serving reads: 1 is an export's from before the built-ins were listed.
READABLE_SCHEMAS = (1, 2)
CONTRACT = "contract.json"
IDS_DIR = "ids"


def ids_files(table: str) -> tuple[str, str]:
    """An export's id files of a dynamic table, relative to the export: keys, rows."""
    return f"{IDS_DIR}/{table}.keys.npy", f"{IDS_DIR}/{table}.rows.npy"


def contract(learner: TableLearner, version: int) -> dict[str, Any]:
    """The scoring contract of an export, as a JSON document."""
    cfg = learner.cfg
    behaviour = [t for t in cfg.builtin_tables if t.feature in BEHAVIOUR_FEATURES]
    context = [t for t in cfg.builtin_tables if t.feature not in BEHAVIOUR_FEATURES]
    t = cfg.sequence_length
    inputs = [
        {"name": "targets", "source": "target_rows", "dtype": "int64", "shape": [-1, len(behaviour)],
         "columns": [x.name for x in behaviour],
         "what": "per candidate, its row in each behaviour table, in column order"},
        {"name": "sequences", "source": "sequence_rows", "dtype": "int64",
         "shape": [-1, len(behaviour), t],
         "columns": [x.name for x in behaviour],
         "what": f"the user's latest {t} behaviours as rows of each behaviour table, oldest first and "
                 f"right-aligned (the latest at position {t - 1}), {PADDING_BUCKET} for padding on the left; "
                 "the same for every candidate of one user"},
        {"name": "users", "source": "user_bucket", "dtype": "int64", "shape": [-1],
         "what": f"the user's statistics bucket: xxh3_64(user id) % {USER_BUCKETS - 1} + 1"},
    ]
    if context:
        inputs.append(
            {"name": "context", "source": "context_rows", "dtype": "int64", "shape": [-1, len(context)],
             "columns": [x.name for x in context],
             "what": "per candidate, the row of its context id (the user's) in each context table"}
        )
    tables = [_table_entry(learner, table) for table in cfg.builtin_tables]
    if learner.plan.input_keys:
        inputs.extend(
            {**i, "shape": [-1 if d is None else d for d in i["shape"]],
             "what": "a declared feature: see features"}
            for i in feature_inputs(learner.plan, t)
        )
    return {
        **feature_contract(learner),
        "features": [*builtin_features(learner, tables), *declared_features(learner)],
        "schema": CONTRACT_SCHEMA,
        "version": version,
        "fingerprint": "xxh3_64 (seed 0) of the id's UTF-8 bytes, as an unsigned 64-bit integer",
        "tables": tables,
        "sequence_length": t,
        "user_buckets": USER_BUCKETS,
        "inputs": inputs,
        "output": {"dtype": "float32", "shape": [-1],
                   "what": "the predictor's only output: the click probability of each candidate"},
        "model": cfg.model_dump(mode="json"),
    }


def _table_entry(learner: TableLearner, table: TableConfig) -> dict[str, Any]:
    """A built-in table's entry: its feature, rows, and how an id becomes a row."""
    entry: dict[str, Any] = {
        "name": table.name, "feature": table.feature, "ids": table.ids,
        "kind": "behaviour" if table.feature in BEHAVIOUR_FEATURES else "context",
        "rows": learner.rows[table.name],
    }
    if table.ids == "dynamic":
        entry["keys"], entry["key_rows"] = ids_files(table.name)
        entry["row_of_id"] = (
            f"look xxh3_64(id) up in {entry['keys']} (sorted); the row is {entry['key_rows']} at "
            f"that index; an id not there reads row {DEFAULT_ROW} (the learned default row)"
        )
    else:
        entry["row_of_id"] = f"xxh3_64(id) % {table.rows - 1} + 1"
    return entry


def builtin_features(learner: TableLearner, tables: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The built-in features' entries (``tables``: the contract's), as a declared feature's.

    The default schema's behaviour features (item, category) feed ``targets`` and
    ``sequences`` through their tables; the user id (the request's user) feeds ``users`` (its
    statistics bucket) and, with a user table, ``context``.
    """
    by_feature = {t["feature"]: t for t in tables}
    out = []
    for spec in (*BUILTIN, USER):
        table = by_feature.get(spec.name)
        if spec.name == USER_FEATURE:
            inputs = ["users", *(["context"] if table else [])]
        else:
            inputs = ["targets", "sequences"] if table else []
        entry: dict[str, Any] = {
            "name": spec.name, "field": spec.source, "kind": spec.kind, "role": spec.role,
            "outcome": spec.outcome, "table": None if table is None else table["name"],
            "transform": spec.transform, "inputs": inputs, "builtin": True,
        }
        if table is not None:
            entry["rows"], entry["row_of_id"] = table["rows"], table["row_of_id"]
        out.append(entry)
    return out


# -- declared features (streamrec.learner.features) -----------------------------------------------


def _input_name(key: str) -> str:
    """A feature input's name in the graph: ``genres/target`` -> ``genres__target``."""
    return key.replace("/", "__")


def feature_inputs(plan: FeaturePlan, t: int) -> list[dict[str, Any]]:
    """The declared features' graph inputs, in order: name, source, feature, side, dtype, shape.

    Their ``source`` is ``feature``: the value of declared feature ``feature`` for the
    candidate (``side`` ``target``) or along the user's sequence (``sequence``), encoded as
    the contract's ``features`` entry says. A shape's None is any batch.
    """
    out = []
    for key in plan.input_keys:
        name, side = key.split("/")
        f = next(f for f in plan.declared if f.name == name)
        shape: list[int | None] = [None] if side == "target" else [None, t]
        if f.pooled:
            shape.append(f.spec.max_ids)
        out.append({
            "name": _input_name(key), "source": "feature", "feature": name, "side": side,
            "dtype": "int64" if f.table else "float32", "shape": shape,
        })
    return out


def declared_features(learner: TableLearner) -> list[dict[str, Any]]:
    """The declared features' entries (none under the default schema)."""
    plan = learner.plan
    if not plan.input_keys:
        return []
    moments = learner.feature_moments
    features = []
    for f in plan.declared:
        entry: dict[str, Any] = {
            "name": f.name, "field": f.spec.source, "kind": f.spec.kind, "role": f.spec.role,
            "outcome": f.spec.outcome, "table": f.table, "transform": f.spec.transform,
            "inputs": [_input_name(k) for k in plan.input_keys if k.split("/")[0] == f.name],
            "builtin": False,
        }
        if f.table is not None:
            rows = plan.tables[f.table][0]
            entry["rows"] = rows
            entry["row_of_id"] = (
                f"bucket: 1 + the number of boundaries <= x, {PADDING_BUCKET} when absent"
                if f.spec.transform == "bucket"
                else f"xxh3_64(id) % {rows - 1} + 1, {PADDING_BUCKET} when absent"
            )
        if f.spec.kind == "ids":
            entry["pooling"] = f"mean over the ids, padded with {PADDING_BUCKET} to max_ids={f.spec.max_ids}"
        if f.spec.transform == "bucket":
            entry["boundaries"] = list(f.spec.boundaries)
        if f.spec.transform == "standardize":
            entry["moments"] = [float(v) for v in moments[f.name]]
        features.append(entry)
    return features


def feature_contract(learner: TableLearner) -> dict[str, Any]:
    """The contract's part on the declared schema (empty under the default schema)."""
    schema = learner.schema
    if not learner.plan.input_keys:
        return {}
    return {
        "feature_schema": schema.to_json(),
        "feature_fingerprint": schema.fingerprint,
        "feature_what": (
            "a number input is transformed (log1p; standardize: (x - mean) / sqrt(m2 / n + 1e-6) "
            "from moments [n, mean, m2], 0.0 while n is 0), 0.0 when absent; behaviour features' "
            "sequence inputs are right-aligned as the sequences, outcomes have no target input"
        ),
    }


def feature_batch_inputs(contract: Mapping[str, Any], batch: SampleColumns) -> dict[str, np.ndarray]:
    """The declared features' inputs of an export for ``batch``, by ``<feature>/<side>`` (none without)."""
    doc = contract.get("feature_schema")
    if not doc:
        return {}
    cfg = ModelConfig.recorded(contract["model"], device="cpu")
    plan = FeaturePlan(cfg, FeatureSchema.from_json(doc))
    moments = Moments(plan.standardized)
    for f in contract["features"]:
        if "moments" in f:
            moments.arrays[f["name"]] = np.asarray(f["moments"], np.float64)
    return encode_features(batch, plan, cfg.sequence_length, moments)


# How each input of a contract is built (its ``source``): the target's rows in the behaviour
# tables named by ``columns``, the user's sequence in them, the context ids' rows in the
# context tables named, the user's statistics bucket, or a declared feature's value (its
# ``feature`` and ``side``: the candidate's, ``target``, or along the sequence, ``sequence``).
SOURCES = ("target_rows", "sequence_rows", "context_rows", "user_bucket", "feature")
SIDES = ("target", "sequence")
# Exports written before the contract stated each input's source: DIN's four, by name.
_SOURCE_BY_NAME = {
    "targets": "target_rows", "sequences": "sequence_rows", "context": "context_rows", "users": "user_bucket"
}


def servable_inputs(contract: Mapping[str, Any], path: Path) -> list[dict[str, Any]]:
    """The contract's inputs, each with its ``source``, in the predictor's order.

    What `streamrec serve` (`streamrec.serving.scorer`) reads of an export's contract; promotion
    asks it too (`streamrec.serving.loading.read_export`), so a version is not pointed at
    that serving cannot load. ``path`` is the export's directory, for the message.

    Raises:
        NotServable: the contract is not one streamrec's scorer reads, or declares an input it
            cannot build (another learner's own export).
    """
    inputs = contract.get("inputs")
    tables = {t.get("name") for t in contract.get("tables", ()) if isinstance(t, dict)}
    readable = {(f, side) for f in _declared(contract) for side in SIDES}
    problem = None
    if contract.get("schema") not in READABLE_SCHEMAS or not isinstance(inputs, list) or not inputs:
        problem = f"its {CONTRACT} declares no inputs of a contract schema in {READABLE_SCHEMAS}"
    else:
        inputs = with_sources(contract)
        for spec in inputs:
            source = spec.get("source")
            unknown = [c for c in spec.get("columns", ()) if c not in tables]
            if source not in SOURCES:
                problem = f"its input {spec.get('name')!r} is built from {source!r}, not one of {SOURCES}"
            elif unknown:
                problem = f"its input {spec.get('name')!r} reads tables it does not list: {unknown}"
            elif source == "feature" and (spec.get("feature"), spec.get("side")) not in readable:
                problem = (
                    f"its input {spec.get('name')!r} reads feature {spec.get('feature')!r} "
                    f"(side {spec.get('side')!r}), which its features do not list"
                )
            if problem is not None:
                break
    if problem is not None or not isinstance(inputs, list):
        raise NotServable(
            f"{path} cannot be served by streamrec: {problem}; score it as its {CONTRACT} says"
        )
    return inputs


def _declared(contract: Mapping[str, Any]) -> list[object]:
    """The declared features a contract lists (the built-ins feed inputs of their own sources)."""
    return [
        f.get("name") for f in contract.get("features", ()) if isinstance(f, dict) and not f.get("builtin")
    ]


def with_sources(contract: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The contract's inputs, each with its ``source`` (stated, or by name: `_with_source`), unchecked.

    What builds a probe batch (`streamrec.serving.onnxfile.probe_inputs`) reads, so an export of a
    release before inputs stated their source is probed as it is served.
    """
    return [_with_source(spec, contract) for spec in contract["inputs"]]


def _with_source(spec: dict[str, Any], contract: Mapping[str, Any]) -> dict[str, Any]:
    """An input spec with its ``source``.

    Exports written before inputs stated it: DIN's four inputs by name, a declared feature's
    (``<feature>__<side>``, listed in its ``features`` entry) as source ``feature``.
    """
    if not isinstance(spec, dict) or spec.get("source"):
        return spec
    name = spec.get("name")
    for f in contract.get("features", ()):
        if isinstance(f, dict) and not f.get("builtin") and name in f.get("inputs", ()):
            return {**spec, "source": "feature", "feature": f["name"], "side": str(name).rsplit("__", 1)[-1]}
    return {**spec, "source": _SOURCE_BY_NAME.get(str(name))}
