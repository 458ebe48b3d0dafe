"""The features a table model reads, built-in (item, category, the user) or declared, and their tables.

A `FeaturePlan` says, from the model configuration and the feature schema, which table
embeds each feature and how wide it enters the model: every table is planned, built
(`streamrec.learner.embedding.EmbeddingArch`) and looked up alike, and the model takes its inputs
by feature, in the plan's order (`model_columns`). `encode_features` turns a batch's declared
`FeatureColumn`s into their inputs; the built-ins' rows come from the learner's id maps
(`streamrec.learner.columns.encode`).

A declared ``id``/``ids`` feature without a table in ``STREAMREC_MODEL__TABLES`` gets a
hashed table of its own, named after it, of `DEFAULT_ROWS` rows x `DEFAULT_DIM` (or the
dim the model asks for); a ``bucket`` number one of ``len(boundaries) + 2`` rows (row 0:
absent, then one per bucket) x the same. Other numbers use no table: they enter as one column, transformed
(``log1p``; ``standardize`` by the running mean and variance the learner keeps in its
state, `Moments`), absent as 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import Any, NoReturn

import numpy as np

from streamrec.config import BUILTIN_TABLE_FEATURES, USER_FEATURE, ModelConfig, TableConfig
from streamrec.errors import ConfigError
from streamrec.features import FeatureSchema, FeatureSpec
from streamrec.learner.columns import Column, EncodedColumns, FeatureColumn, Jagged, SampleColumns, positions
from streamrec.learner.hashing import PADDING_BUCKET, fingerprint, to_buckets

# 2^16 rows: genres, tags, devices and countries number far fewer, so few ids share a row;
# at D=8 with Adam's two moments about 6 MB a table.
DEFAULT_ROWS = 2**16
# Narrower than the item's 16: a declared feature is a coarser signal than the item itself.
DEFAULT_DIM = 8
# Keeps standardize finite for a constant feature (variance 0).
STANDARDIZE_EPS = 1e-6


#: The user id as a model reads it: the event contract's ``user_id``, one id per sample, a
#: property of the user. Not a schema feature (a schema never declares the contract's own
#: fields); a table whose ``feature`` is ``user`` embeds it.
USER = FeatureSpec.model_construct(name=USER_FEATURE, field="user_id", kind="id", role="user", required=True)


@dataclass(frozen=True)
class PlannedFeature:
    """One feature as the model reads it, built-in (item, category, the user) or declared.

    Attributes:
        spec: Its declaration (its name, kind and role).
        table: The table embedding it; None for a number read as one column.
        width: The columns it adds: its table's width, or 1.
        builtin: One of the event contract's ids (item, category, user), whose rows the
            learner's id maps (or hashing) give from the sample's own columns: they are what
            the id statistics, the match features and the known items count (DIN's wide part
            too, and the declared behaviour features of ids: `streamrec.learner.model.biased`),
            and training looks each distinct row of theirs up once
            (`streamrec.learner.embedding.distinct_lookup`).
    """

    spec: FeatureSpec
    table: str | None
    width: int
    builtin: bool = False

    @property
    def name(self) -> str:
        """The feature's name."""
        return self.spec.name

    @property
    def pooled(self) -> bool:
        """Whether a value holds several ids (``ids``), mean-pooled into one vector."""
        return self.spec.kind == "ids"

    @property
    def query(self) -> bool:
        """Whether the target has it (a behaviour feature, not an outcome)."""
        return self.spec.role == "behaviour" and not self.spec.outcome


class FeaturePlan:
    """Every feature a table model reads and every table it builds: one plan for all of them.

    ``tables`` holds every table by name, (rows, dim): the built-in features' first (in
    ``cfg.tables`` order), then the declared features' (in schema order); two features may
    share one. ``features`` lists every feature read, the built-ins first. The model's sides:
    ``query`` the behaviour features a target has (built-ins first), ``sequence`` those and the
    outcomes after them (a target vector's columns line up with a behaviour's), ``head`` the
    user and context features (the user id's first). The model's inputs are one per
    `keys` entry, in that order.

    A plan is immutable once built (its attributes refuse assignment, its tables and
    sequences are read-only), so what it derives (`inputs`, `keys`, `declared`, the widths)
    is computed once, at first use.
    """

    _frozen = False  # set at the end of __init__: from then on, attributes refuse assignment

    def __init__(self, cfg: ModelConfig, schema: FeatureSchema, dim: int = DEFAULT_DIM) -> None:
        """Plan ``cfg``'s tables and ``schema``'s features.

        ``dim`` is the width of a table the plan gives a declared feature without one of its
        own (a DeepFM asks for its tables' one dim: FM's dot products need every field alike).

        Raises:
            ConfigError: a table names a feature the schema does not declare, a number
                without ``bucket`` has a table, or a default table's name is taken.
        """
        self.schema = schema
        tables: dict[str, tuple[int, int]] = {}  # table -> (rows, dim)
        self.dynamic: Mapping[str, int] = MappingProxyType(
            {t.name: t.start_rows for t in cfg.tables if t.ids == "dynamic"}
        )
        declared = {f.name for f in schema.extras}
        taken = {t.name for t in cfg.tables}
        for declared_table in cfg.tables:
            for name in (declared_table.feature, *declared_table.also):
                if name not in BUILTIN_TABLE_FEATURES and name not in declared:
                    raise ConfigError(
                        f"table {declared_table.name} embeds feature {name!r}, which is not declared "
                        "(STREAMREC_FEATURES)"
                    )
        builtin = {**{f.name: f for f in schema.features if f not in schema.extras}, USER_FEATURE: USER}
        features = [
            _add(tables, PlannedFeature(builtin[t.feature], t.name, t.dim, builtin=True), t.rows)
            for t in cfg.builtin_tables
        ]
        for spec in schema.extras:
            table: TableConfig | None = cfg.table(spec.name)
            if spec.kind == "number" and spec.transform != "bucket":
                if table is not None:
                    raise ConfigError(f"table {table.name}: number feature {spec.name!r} has no ids to embed")
                features.append(PlannedFeature(spec, None, 1))
            elif table is not None:
                features.append(_add(tables, PlannedFeature(spec, table.name, table.dim), table.rows))
            elif spec.name in taken:
                raise ConfigError(
                    f"feature {spec.name!r} needs a table and table {spec.name} embeds another "
                    f"feature: give {spec.name!r} a table in STREAMREC_MODEL__TABLES"
                )
            else:
                rows = len(spec.boundaries) + 2 if spec.transform == "bucket" else DEFAULT_ROWS
                features.append(_add(tables, PlannedFeature(spec, spec.name, dim), rows))
        self.tables: Mapping[str, tuple[int, int]] = MappingProxyType(tables)
        self.features = tuple(features)
        self.query = tuple(f for f in features if f.query)
        self.sequence = (*self.query, *(f for f in features if f.spec.outcome))
        self.head = tuple(f for f in features if f.spec.role != "behaviour")
        self._frozen = True

    def __setattr__(self, name: str, value: Any) -> None:
        """Set an attribute while the plan is built; refused after."""
        if self._frozen:
            self._refuse(name)
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        """Refused: a plan is immutable."""
        self._refuse(name)

    def _refuse(self, name: str) -> NoReturn:
        raise AttributeError(f"a FeaturePlan is immutable: {name} cannot change; build another plan")

    @cached_property
    def start_rows(self) -> Mapping[str, int]:
        """Each table's rows to start with: a dynamic table's initial rows, a hashed table's all."""
        start = {name: self.dynamic.get(name, rows) for name, (rows, _) in self.tables.items()}
        return MappingProxyType(start)

    @cached_property
    def inputs(self) -> tuple[tuple[PlannedFeature, str], ...]:
        """The model's inputs in its order, each a feature and its side (``target``, ``sequence``)."""
        return (
            *((f, "target") for f in self.query),
            *((f, "sequence") for f in self.sequence),
            *((f, "target") for f in self.head),
        )

    @cached_property
    def keys(self) -> tuple[str, ...]:
        """The model's inputs' keys, ``<feature>/<side>``, in its order (`inputs`)."""
        return tuple(f"{f.name}/{side}" for f, side in self.inputs)

    @cached_property
    def input_keys(self) -> tuple[str, ...]:
        """The declared features' keys of `keys` (see `encode_features`): an export's feature inputs.

        The built-in features' rows reach an export as its ``targets``, ``sequences`` and
        ``context`` inputs, as the wire contract has always named them.
        """
        declared = {f.name for f in self.features if not f.builtin}
        return tuple(k for k in self.keys if k.split("/")[0] in declared)

    @cached_property
    def n_context(self) -> int:
        """The built-in user and context features (an export's ``context`` columns)."""
        return sum(f.builtin for f in self.head)

    @cached_property
    def declared(self) -> tuple[PlannedFeature, ...]:
        """The declared features (beyond the built-ins), in `sequence` then `head` order."""
        return tuple(f for f in (*self.sequence, *self.head) if not f.builtin)

    def table_of(self, name: str) -> str | None:
        """The table embedding feature ``name`` (None: a number read as a column)."""
        return next((f.table for f in self.features if f.name == name), None)

    @cached_property
    def query_width(self) -> int:
        """The width of the target's vector (and of each behaviour's, before its outcomes)."""
        return sum(f.width for f in self.query)

    @cached_property
    def outcome_width(self) -> int:
        """Columns a behaviour's vector gains from outcome features (the target's are zero)."""
        return sum(f.width for f in self.sequence if not f.query)

    @cached_property
    def head_width(self) -> int:
        """Columns the head gains from the user and context features."""
        return sum(f.width for f in self.head)

    @cached_property
    def standardized(self) -> tuple[str, ...]:
        """The features standardized by running moments."""
        return tuple(f.name for f in self.features if f.spec.transform == "standardize")


def _add(tables: dict[str, tuple[int, int]], feature: PlannedFeature, rows: int) -> PlannedFeature:
    """Plan ``feature``'s table in ``tables`` (once, when two features share it)."""
    assert feature.table is not None  # noqa: S101 -- only features with a table are added
    tables.setdefault(feature.table, (rows, feature.width))
    return feature


def model_columns(encoded: EncodedColumns, plan: FeaturePlan) -> list[np.ndarray]:
    """The model's inputs of an encoded batch, one per `FeaturePlan.keys` entry, in order.

    A built-in feature's are its table's rows of the batch (``encoded.targets``,
    ``sequences``, ``context``: what the id maps gave); a declared feature's its
    `encode_features` input.
    """
    out = []
    for f, side in plan.inputs:
        if not f.builtin:
            out.append(encoded.extras[f"{f.name}/{side}"])
        elif side == "sequence":
            out.append(encoded.sequences[str(f.table)])
        else:
            out.append((encoded.targets if f.spec.role == "behaviour" else encoded.context)[str(f.table)])
    return out


class Moments:
    """Running count, mean and variance (Welford, merged per batch) of standardized features.

    Updated after each batch is learnt, as the id statistics: a batch's own values never
    shape its scores. A feature without moments reads as absent (0.0); the first batch that
    has its values gives it moments before it is trained on (`TableLearner`), so it is never
    trained on raw values. State: float64[3] (count, mean, sum of squared deviations) per feature.
    """

    def __init__(self, names: Iterable[str]) -> None:
        """Empty moments for ``names``."""
        self.arrays = {n: np.zeros(3, np.float64) for n in names}

    def state_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        """The moments as state arrays under ``prefix``."""
        return {f"{prefix}{n}/moments": a.copy() for n, a in self.arrays.items()}

    def load_state_arrays(self, arrays: Mapping[str, np.ndarray], prefix: str) -> None:
        """Restore what `state_arrays` returned."""
        for name in self.arrays:
            self.arrays[name] = np.asarray(arrays[f"{prefix}{name}/moments"], np.float64).copy()

    def standardize(self, name: str, x: np.ndarray) -> np.ndarray:
        """``x`` centred and scaled by the moments so far; 0.0 (absent) before any.

        Read raw, a year (~2,000) given to a model trained without it swung its scores (a
        micro-batch's logloss 5.12 against 0.69-0.71 either side).
        """
        n, mean, m2 = self.arrays[name]
        if not n:
            return np.zeros(x.shape, np.float32)
        return ((x - mean) / np.sqrt(m2 / n + STANDARDIZE_EPS)).astype(np.float32)

    def update(self, name: str, x: np.ndarray) -> None:
        """Merge the finite values of ``x``."""
        x = x[np.isfinite(x)].astype(np.float64)
        if not len(x):
            return
        n, mean, m2 = self.arrays[name]
        k, xmean = len(x), float(x.mean())
        xm2 = float(((x - xmean) ** 2).sum())
        total = n + k
        delta = xmean - mean
        self.arrays[name] = np.array([total, mean + delta * k / total, m2 + xm2 + delta**2 * n * k / total])


def encode_features(
    batch: SampleColumns, plan: FeaturePlan, t: int, moments: Moments
) -> dict[str, np.ndarray]:
    """The model's extra inputs of ``batch``: ``<name>/target`` and ``<name>/sequence`` arrays.

    Per feature: an id's rows int64 [B] and [B, T]; ids' int64 [B, M] and [B, T, M] (M its
    ``max_ids``, 0 padding); a number's float32 [B] and [B, T]. A feature the batch lacks
    reads as absent (row 0, or 0.0).

    Raises:
        ValueError: a feature's values are not of its declared kind.
    """
    b = len(batch)
    rows, cols, keep = positions(batch.seq_lengths, t)
    n = int(batch.seq_lengths.sum())
    out: dict[str, np.ndarray] = {}
    for f in plan.declared:
        column = batch.features.get(f.name)
        _check_kind(f, column)
        if f.query or f.spec.role != "behaviour":
            out[f"{f.name}/target"] = _encode(f, None if column is None else column.target, b, plan, moments)
        if f.spec.role == "behaviour":
            along = _encode(f, None if column is None else column.sequence, n, plan, moments)
            seq = np.zeros((b, t, *along.shape[1:]), dtype=along.dtype)
            seq[rows, cols] = along[keep]
            out[f"{f.name}/sequence"] = seq
    return out


def feature_values(batch: SampleColumns, plan: FeaturePlan, name: str) -> np.ndarray:
    """float32: a number feature's raw values in ``batch`` (the target's, or along sequences)."""
    column = batch.features.get(name)
    if column is None:
        return np.zeros(0, np.float32)
    side = column.target if column.target is not None else column.sequence
    return side if isinstance(side, np.ndarray) else np.zeros(0, np.float32)


def _check_kind(f: PlannedFeature, column: FeatureColumn | None) -> None:
    if column is None or column.kind == f.spec.kind:
        return
    sides = [s for s in (column.target, column.sequence) if s is not None]
    if column.kind == "number" and all(isinstance(s, np.ndarray) and np.isnan(s).all() for s in sides):
        return  # no value at all reads as a number: absent
    raise ValueError(f"feature {f.name!r} is declared {f.spec.kind} but the batch holds {column.kind} values")


def _encode(
    f: PlannedFeature, column: Column | None, size: int, plan: FeaturePlan, moments: Moments
) -> np.ndarray:
    """One side of a feature as model input (see `encode_features`)."""
    spec = f.spec
    if spec.kind == "number":
        x = np.full(size, np.nan, np.float32) if not isinstance(column, np.ndarray) else column
        if spec.transform == "bucket":
            buckets = np.searchsorted(np.asarray(spec.boundaries), x, side="right") + 1
            return np.where(np.isnan(x), PADDING_BUCKET, buckets).astype(np.int64)
        if spec.transform == "log1p":
            with np.errstate(invalid="ignore", divide="ignore"):
                x = np.log1p(np.where(x > -1, x, np.nan)).astype(np.float32)
        elif spec.transform == "standardize":
            x = moments.standardize(f.name, x)
        return np.nan_to_num(x, nan=0.0).astype(np.float32)
    assert f.table is not None
    table_rows = plan.tables[f.table][0]
    if spec.kind == "id":
        ids: list[str] = column if isinstance(column, list) else [""] * size
        rows = to_buckets(fingerprint(ids), table_rows)
        rows[np.array([not v for v in ids], dtype=bool)] = PADDING_BUCKET
        return rows
    jagged = column if isinstance(column, Jagged) else Jagged([], np.zeros(size + 1, np.int64))
    m = spec.max_ids
    out = np.zeros((size, m), np.int64)
    lengths = np.diff(jagged.offsets)
    owner = np.repeat(np.arange(size, dtype=np.int64), lengths)
    slot = np.arange(len(jagged.values), dtype=np.int64) - np.repeat(jagged.offsets[:-1], lengths)
    fits = slot < m
    if len(jagged.values):
        out[owner[fits], slot[fits]] = to_buckets(fingerprint(jagged.values), table_rows)[fits]
    return out
