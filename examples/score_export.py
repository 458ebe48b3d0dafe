r"""Score with a streamrec export using only numpy, xxhash and Paddle Inference or ONNX Runtime: no streamrec.

Copy this into a serving service. An export (``<snapshots>/exports/v000007/``, or
``streamrec snapshot export 7``) holds the model, the id tables and ``contract.json``, which
describes every input; this file follows it. The model runs on ONNX Runtime when the contract
names its ONNX graph (the ``onnx`` entry, ``model.onnx``: exports written where paddle2onnx is
installed) and onnxruntime imports, else on Paddle Inference; ``--engine`` (``Export(path,
engine)``) asks for one. ONNX Runtime scores the same within 1e-5 in a quarter to a third of Paddle's time,
and a service using it needs no Paddle installed.

    python examples/score_export.py EXPORT_DIR USER_ID ITEM[:CATEGORY] ... \
        --history ITEM:CATEGORY,ITEM:CATEGORY,...      (the user's behaviours, oldest first; or a JSON
                                                       list as POST /score's, with their features)
        --context '{"device": "ios"}'                 (the model's declared context features)
        --engine auto|onnx|paddle                     (auto: onnx when the export has it)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

PADDING = 0  # row 0 of every table: padding, reads zeros
DEFAULT = 1  # row 1 of a dynamic table: the learned default for ids without their own row
# Exports written before each input stated its source.
LEGACY_SOURCES = {
    "targets": "target_rows", "sequences": "sequence_rows", "users": "user_bucket", "context": "context_rows"
}
# Exports whose contract (schema 1) lists no built-in features: the event contract's two ids.
LEGACY_PAIR = (("item", "item_id"), ("category", "category_id"))


def fingerprint(ids: list[str]) -> np.ndarray:
    """xxh3_64 (seed 0) of each id's UTF-8 bytes."""
    return np.array([xxhash.xxh3_64_intdigest(i.encode()) for i in ids], dtype=np.uint64)


class NoOnnxGraph(ValueError):
    """ONNX Runtime was asked for, but the export has no ONNX graph or onnxruntime is missing."""


def choose_engine(path: Path, contract: dict, engine: str = "auto") -> str:
    """``onnx`` or ``paddle``: what runs the export at ``path`` when ``engine`` is asked for.

    Raises:
        NoOnnxGraph: ``onnx`` asked for and not possible, saying why.
    """
    if engine == "paddle":
        return "paddle"
    entry = contract.get("onnx")
    why = None
    if not isinstance(entry, dict) or not (path / str(entry.get("file"))).is_file():
        why = f"{path} has no ONNX graph (its contract.json names none)"
    elif importlib.util.find_spec("onnxruntime") is None:
        why = "onnxruntime is not installed (pip install onnxruntime)"
    if why is None:
        return "onnx"
    if engine == "onnx":
        raise NoOnnxGraph(f"{why}; --engine paddle or auto scores it with Paddle")
    return "paddle"


def paddle_runner(path: Path) -> Any:
    """A function of the inputs by name to the scores, on Paddle Inference (CPU, oneDNN)."""
    from paddle import inference

    config = inference.Config(str(path / "model.json"), str(path / "model.pdiparams"))
    config.disable_gpu()
    config.enable_mkldnn()  # oneDNN: Paddle's fast CPU kernels
    config.disable_glog_info()
    predictor = inference.create_predictor(config)

    def run(feed: dict[str, np.ndarray]) -> np.ndarray:
        for name in predictor.get_input_names():
            handle = predictor.get_input_handle(name)
            handle.reshape(feed[name].shape)
            handle.copy_from_cpu(np.ascontiguousarray(feed[name]))
        predictor.run()
        return predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()

    return run


def onnx_runner(path: Path, contract: dict) -> Any:
    """A function of the inputs by name to the scores, on ONNX Runtime (CPU, sequential)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3  # errors only: a converted graph's warnings need no action
    session = ort.InferenceSession(
        str(path / contract["onnx"]["file"]), options, providers=["CPUExecutionProvider"]
    )
    names, output = [i.name for i in session.get_inputs()], session.get_outputs()[0].name

    def run(feed: dict[str, np.ndarray]) -> np.ndarray:
        return session.run([output], {name: np.ascontiguousarray(feed[name]) for name in names})[0]

    return run


class Export:
    """An export directory: contract, id tables and the model on Paddle Inference or ONNX Runtime."""

    def __init__(self, path: Path, engine: str = "auto") -> None:
        """Load the export at ``path``; ``engine`` auto, onnx or paddle (see `choose_engine`)."""
        self.contract = json.loads((path / "contract.json").read_text())
        self.tables = {t["name"]: t for t in self.contract["tables"]}
        self.features = {f["name"]: f for f in self.contract.get("features", [])}  # built-in and declared
        # The built-in behaviour features (name, event field) whose ids a candidate's or a
        # behaviour's pair gives, in order.
        builtins = [f for f in self.features.values() if f.get("builtin") and f["role"] == "behaviour"]
        self.pair = tuple((f["name"], f["field"]) for f in builtins) or LEGACY_PAIR
        self.ids = {  # sorted fingerprints and their rows, per dynamic table
            t["name"]: (np.load(path / t["keys"], allow_pickle=False), np.load(path / t["key_rows"]))
            for t in self.contract["tables"] if t["ids"] == "dynamic"
        }
        self.engine = choose_engine(path, self.contract, engine)
        self.run = onnx_runner(path, self.contract) if self.engine == "onnx" else paddle_runner(path)

    def rows(self, table: str, ids: list[str | None]) -> np.ndarray:
        """Each id's row in ``table`` (None, an unknown category: the default or padding)."""
        spec = self.tables[table]
        dynamic = spec["ids"] == "dynamic"
        out = np.full(len(ids), DEFAULT if dynamic else PADDING, np.int64)
        present = [k for k, i in enumerate(ids) if i is not None]
        keys = fingerprint([i for i in ids if i is not None])
        if not dynamic:
            out[present] = (keys % np.uint64(spec["rows"] - 1)).astype(np.int64) + 1
        elif len(self.ids[table][0]):
            sorted_keys, key_rows = self.ids[table]
            at = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
            hit = sorted_keys[at] == keys
            found = np.full(len(keys), DEFAULT, np.int64)
            found[hit] = key_rows[at[hit]]
            out[present] = found
        return out

    def of(self, table: str, pair: tuple[str, str | None]) -> str | None:
        """The id ``table`` embeds of a pair of the built-in behaviour features' ids (`pair`)."""
        names = [name for name, _ in self.pair]
        return pair[names.index(self.tables[table]["feature"])]

    def encoded(self, name: str, value: Any) -> Any:
        """A declared feature's value as its input: a row, rows or a number (None: absent)."""
        f = self.features[name]
        if f["kind"] == "id":
            rows = self.rows_of_feature(f, [str(value)] if value not in (None, "") else [])
            return rows[0] if len(rows) else PADDING
        if f["kind"] == "ids":
            return self.rows_of_feature(f, [str(v) for v in value or []])
        x = math.nan if value is None else float(str(value))
        if f["transform"] == "bucket":
            return PADDING if math.isnan(x) else 1 + sum(b <= x for b in f["boundaries"])
        if f["transform"] == "log1p":
            x = math.log1p(x) if x > -1 else math.nan
        elif f["transform"] == "standardize":
            count, mean, m2 = f["moments"]
            x = (x - mean) / (math.sqrt(m2 / count + 1e-6) if count else 1.0)
        return 0.0 if math.isnan(x) else x

    def rows_of_feature(self, f: dict, ids: list[str]) -> list[int]:
        """A declared id feature's rows of ``ids`` (its hashed table)."""
        return [int(k % np.uint64(f["rows"] - 1)) + 1 for k in fingerprint(ids)]

    def feature_input(self, spec: dict, n: int, request: dict) -> np.ndarray:
        """A ``feature`` input from the request's values (see `score`); one not given reads its default."""
        # Exports written before each input stated its source name them <feature>__<side>.
        name, side = spec.get("feature"), spec.get("side")
        if name is None:
            name, side = spec["name"].rsplit("__", 1)
        f, t = self.features[name], self.contract["sequence_length"]
        array = np.zeros([n if d == -1 else d for d in spec["shape"]], spec["dtype"])
        if side == "sequence":  # along the history, right-aligned as the sequences
            values = list(request["along"].get(name, []))[-t:]
            for k, value in enumerate(values):
                self.put(array[:, t - len(values) + k : t - len(values) + k + 1], f, value)
        elif f["role"] == "behaviour":  # each candidate's own
            for i, given in enumerate(request["items"]):
                self.put(array[i : i + 1], f, given.get(name))
        else:  # the user's or the moment's: one value for every candidate
            self.put(array, f, request[f["role"]].get(name))
        return array

    def put(self, out: np.ndarray, f: dict, value: Any) -> None:
        """Write one value of feature ``f``, encoded, into ``out`` (ids: rows first, padding after)."""
        encoded = self.encoded(f["name"], value)
        if f["kind"] == "ids":
            rows = encoded[: out.shape[-1]]
            out[..., : len(rows)] = rows
        else:
            out[...] = encoded

    def score(
        self,
        user: str,
        history: list[tuple[str, str]],
        candidates: list[tuple[str, str | None]],
        context: dict | None = None,
        user_features: dict | None = None,
        along: dict | None = None,
        item_features: list[dict] | None = None,
    ) -> np.ndarray:
        """Click probabilities of ``candidates`` ((item, category or None): `pair`'s) for ``user``.

        Each input is built as the contract declares it (its ``source`` and ``columns``), so
        this serves every streamrec model's export (DIN, DeepFM) alike. Declared features, by
        name: ``context`` the request's, ``user_features`` the user's, ``along`` each behaviour
        feature's values along ``history`` (aligned with it, None where absent) and
        ``item_features`` each candidate's own; a feature not given reads its default.
        """
        n, t = len(candidates), self.contract["sequence_length"]
        recent = history[-t:]
        buckets = self.contract["user_buckets"]
        feed = {}
        for spec in self.contract["inputs"]:
            source = spec.get("source") or LEGACY_SOURCES.get(spec["name"], "feature")
            columns = spec.get("columns", [])
            if source == "user_bucket":
                array = np.repeat((fingerprint([user]) % np.uint64(buckets - 1)).astype(np.int64) + 1, n)
            elif source == "context_rows":  # the user's row in each context table
                array = np.tile(np.array([self.rows(c, [user])[0] for c in columns], np.int64), (n, 1))
            elif source == "target_rows":
                array = np.stack([self.rows(c, [self.of(c, x) for x in candidates]) for c in columns], 1)
            elif source == "sequence_rows":  # right-aligned, padding on the left
                array = np.full((n, len(columns), t), PADDING, np.int64)
                for col, table in enumerate(columns):
                    if recent:
                        seq = self.rows(table, [self.of(table, h) for h in recent])
                        array[:, col, t - len(recent) :] = seq
            elif source == "feature":  # a declared feature's value, the target's or along the sequence
                request = {"context": context or {}, "user": user_features or {}, "along": along or {},
                           "items": item_features or [{}] * n}
                array = self.feature_input(spec, n, request)
            else:
                raise ValueError(f"input {spec['name']}: unknown source {source!r}")
            feed[spec["name"]] = array.astype(spec["dtype"])
        return self.run(feed)


def behaviours(
    text: str, pair: tuple[tuple[str, str], ...] = LEGACY_PAIR
) -> tuple[list[tuple[str, str]], dict[str, list[Any]]]:
    """``--history``: (item, category) pairs and each feature along them (None where not given).

    ``ITEM:CATEGORY,...``, or a JSON list of [item, category] pairs and objects
    ``{"item_id": ..., "category_id": ..., "genres": [...]}`` (POST /score's ``history``): the
    pair's features by event field or name (``pair``: `Export.pair`).
    """
    if not text.lstrip().startswith("["):
        return [(h.partition(":")[0], h.partition(":")[2]) for h in text.split(",") if h], {}
    (first, first_field), (second, second_field) = pair
    entries = [
        e if isinstance(e, dict) else {first_field: e[0], second_field: e[1]} for e in json.loads(text)
    ]
    pairs = [
        (str(e.get(first_field, e.get(first))), str(e.get(second_field, e.get(second)))) for e in entries
    ]
    names = {k for e in entries for k in e if k not in (first, first_field, second, second_field)}
    return pairs, {name: [e.get(name) for e in entries] for name in sorted(names)}


def main() -> None:
    """Score the items on the command line and print one probability per item."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", type=Path)
    parser.add_argument("user")
    parser.add_argument("items", nargs="+", help="ITEM or ITEM:CATEGORY")
    parser.add_argument("--history", default="", help="ITEM:CATEGORY,... or a JSON list, oldest first")
    parser.add_argument("--context", default="{}", help="declared context features, a JSON object")
    parser.add_argument(
        "--engine", choices=("auto", "onnx", "paddle"), default="auto",
        help="what runs the model (default auto: ONNX Runtime when the export has its graph, else Paddle)",
    )
    args = parser.parse_args()
    candidates = [(i.partition(":")[0], i.partition(":")[2] or None) for i in args.items]
    try:
        export = Export(args.export, args.engine)
    except NoOnnxGraph as exc:
        parser.error(str(exc))
    history, along = behaviours(args.history, export.pair)
    scores = export.score(args.user, history, candidates, json.loads(args.context), along=along)
    print(json.dumps({item: round(float(s), 6) for item, s in zip(args.items, scores, strict=True)}))


if __name__ == "__main__":
    main()
