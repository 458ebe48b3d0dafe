"""The model section: the learner class, its embedding tables and hyper-parameters."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field, TypeAdapter, ValidationError, model_validator

from streamrec.config.section import SECTION
from streamrec.features.schema import BUILTIN

#: A table's feature: ``item``, ``category``, ``user`` (the user id) or a declared feature's name.
Feature = str
#: The user id as a table's feature: every sample's own, embedded once per sample.
USER_FEATURE: Feature = "user"
#: The default schema's behaviour features, seen both as the target and along the behaviour
#: sequence (DIN attends over them).
BEHAVIOUR_FEATURES: tuple[Feature, ...] = tuple(f.name for f in BUILTIN if f.role == "behaviour")
#: The features of the event contract itself (the default schema's and the user); a table of
#: any other embeds a declared feature.
BUILTIN_TABLE_FEATURES: tuple[Feature, ...] = (*(f.name for f in BUILTIN), USER_FEATURE)


class TableConfig(BaseModel):
    """One embedding table, as torchrec's ``EmbeddingBagConfig``.

    The feature whose ids it embeds, its rows and its width, and how ids get rows.

    ``item`` and ``category`` are behaviour features: the table embeds the target's id and
    every id along the behaviour sequence, and DIN attends over them. ``user`` is a context
    feature: embedded once per sample and fed to the MLP head.

    Any other ``feature`` names a declared feature (``STREAMREC_FEATURES``); ``also`` names
    more declared features that share the table's rows (a ``genres`` and a ``main_genre``, say).
    A declared feature's table is hashed (``ids="hashed"``); a declared feature with no table
    here gets a hashed one of its own (`streamrec.learner.features`).

    ``ids="dynamic"`` (the default, `streamrec.learner.idmap`): an id seen ``min_count``
    times as a target (or as the context) gets a row of its own, so ids never share one;
    until then it uses the table's learned default row. The table starts at
    ``initial_rows`` and doubles as ids arrive, up to ``rows``; an id unseen for ``ttl_s``
    of event time gives its row back for reuse. ``ids="hashed"``: ids hash into exactly
    ``rows`` rows, fixed memory, and unrelated ids share rows.
    """

    model_config = SECTION

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    feature: Feature = Field(pattern=r"^[a-z][a-z0-9_]*$")
    # More declared features embedded in this table (declared features' tables only).
    also: tuple[str, ...] = ()
    ids: Literal["dynamic", "hashed"] = "dynamic"
    # The most rows, padding (row 0) and, for dynamic tables, the default row (1) included.
    rows: int = Field(ge=3)
    dim: int = Field(16, ge=1)
    # Measured with the backtester (README, "The model"): an id's own row from its first
    # sighting scored best on MovieLens and Taobao; 2 or 3 lost up to 0.1 GAUC on Taobao,
    # where a target seen once before is common and its one sample tells.
    min_count: int = Field(1, ge=1)
    # None: rows are taken back only when the table is full (the least recently seen ids
    # first). A TTL suits a catalogue with steady churn (30 days for a shop); on MovieLens,
    # whose ratings are sparse over 22 years, a 30-day TTL cost 0.05 GAUC.
    ttl_s: float | None = Field(None, gt=0)
    initial_rows: int = Field(4096, ge=3)

    @property
    def start_rows(self) -> int:
        """The rows the table starts with."""
        return self.rows if self.ids == "hashed" else min(self.initial_rows, self.rows)


# What a model configuration saved before a setting existed implies for it (a snapshot's
# manifest keeps the model's settings): the model was built without it.
MODEL_SETTINGS_BEFORE: dict[str, object] = {"match_features": False}
# Settings that only start a model (or place it): a snapshot loads whatever they are, so a
# snapshot that does not load is never down to them.
MODEL_SETTINGS_INIT_ONLY: frozenset[str] = frozenset({"device", "seed", "match_init"})


class ModelConfig(BaseModel):
    """DIN hyper-parameters (env ``STREAMREC_MODEL__*``)."""

    model_config = SECTION

    # Which model learns: a built-in by its short name, or a user's own class by its import
    # path, as feast loads backends (see streamrec.learner.registry).
    learner: str = Field(
        "din",
        min_length=1,
        description=(
            "STREAMREC_MODEL__LEARNER (a built-in: din or deepfm; or your own learner class as "
            "package.module:ClassName)"
        ),
    )

    # Items: a dynamic table, starting small and growing with the ids in use, up to 2^21 (about
    # 250 bytes a row with Adam, 450 with EWC, at D=16: ~0.5-0.9 GB when full). Categories: a
    # hashed table of 2^16 rows (~14 MB with Adam), so every category has its row from its first
    # event, where a dynamic table gives a new id the shared default row until a micro-batch
    # has been learnt (and the match features read zero for all of the first one). Taobao's
    # full dataset has ~9.4k categories: ~13% of them share a row with another, which costs
    # little as a category's row is a coarse signal. Before this default the category table was
    # dynamic: STREAMREC_MODEL__TABLES='[{"name": "item", "feature": "item", "rows": 2097152},
    # {"name": "category", "feature": "category", "rows": 65536}]' resumes such a snapshot.
    # Adding a table (a user table, say) is a change here, not in the code.
    tables: tuple[TableConfig, ...] = Field(
        (
            TableConfig(name="item", feature="item", rows=2**21, dim=16),
            TableConfig(name="category", feature="category", ids="hashed", rows=2**16, dim=16),
        ),
        description=(
            "STREAMREC_MODEL__TABLES (JSON list of {name, feature, rows, dim, ids, min_count, "
            "ttl_s, initial_rows, also}; feature: item, category, user or a declared feature, "
            "also: more declared features sharing the table)"
        ),
    )
    # Behaviours per sample: the consumers keep and emit each user's latest this many, and
    # the model reads as many. DIN papers use 20-100; 50 is the measured sweet spot of cost
    # and recall.
    sequence_length: int = Field(50, ge=1, description="STREAMREC_MODEL__SEQUENCE_LENGTH")
    # A bias per id of each table, added to the logit (see learner.embedding.WideArch), learning
    # this many times faster than the rest.
    wide: bool = Field(True, description="STREAMREC_MODEL__WIDE")
    id_stats: bool = Field(True, description="STREAMREC_MODEL__ID_STATS")
    # The target's share and count in its own history, per behaviour table (see
    # learner.model.MatchArch): the head's inputs and a fast linear term of the logit.
    match_features: bool = Field(True, description="STREAMREC_MODEL__MATCH_FEATURES")
    match_lr_scale: float = Field(10.0, gt=0, description="STREAMREC_MODEL__MATCH_LR_SCALE")
    # The weight each behaviour table's share feature starts at in the logit: 0 learns it from
    # nothing, as every other weight; 1, with the hashed category table, ranks by the category
    # match from the first event (Taobao first quarter GAUC 0.798 -> 0.829; MovieLens, where
    # genres tell little, 0.001 lower: a near-tie). Initialisation only: snapshots load
    # whatever it is.
    match_init: float = Field(1.0, description="STREAMREC_MODEL__MATCH_INIT")
    wide_lr_scale: float = Field(10.0, gt=0, description="STREAMREC_MODEL__WIDE_LR_SCALE")
    attention_units: tuple[int, ...] = Field((64, 32), description="STREAMREC_MODEL__ATTENTION_UNITS")
    mlp_units: tuple[int, ...] = Field((128, 64), description="STREAMREC_MODEL__MLP_UNITS")
    learning_rate: float = Field(1e-3, gt=0, description="STREAMREC_MODEL__LEARNING_RATE")
    train_batch_size: int = Field(256, ge=1, description="STREAMREC_MODEL__TRAIN_BATCH_SIZE")
    passes: int = Field(1, ge=1, description="STREAMREC_MODEL__PASSES over each micro-batch")
    # Online EWC (learner.ewc): lambda 0 is plain fine-tuning. gamma is how much of the
    # Fisher estimate carries into the next micro-batch; normalising each micro-batch's Fisher
    # to a mean of 1 makes lambda independent of the loss's scale. The default came out of
    # the backtester's sweep (README, "Online EWC").
    ewc_lambda: float = Field(0.0, ge=0, description="STREAMREC_MODEL__EWC_LAMBDA (0: off)")
    ewc_gamma: float = Field(0.9, ge=0, le=1, description="STREAMREC_MODEL__EWC_GAMMA")
    ewc_normalise: bool = Field(True, description="STREAMREC_MODEL__EWC_NORMALISE")
    seed: int = Field(0, description="STREAMREC_MODEL__SEED")
    device: str = Field(
        "auto", pattern=r"^(auto|cpu|gpu(:\d+)?)$",
        description="STREAMREC_MODEL__DEVICE: auto, cpu or gpu[:N]",
    )

    @model_validator(mode="after")
    def _tables_fit_din(self) -> ModelConfig:
        names = [t.name for t in self.tables]
        features = [f for t in self.tables for f in (t.feature, *t.also)]
        if len(set(names)) != len(names) or len(set(features)) != len(features):
            raise ValueError(f"table names and features must be unique: {names} / {features}")
        for t in self.tables:
            if t.feature in BUILTIN_TABLE_FEATURES and t.also:
                raise ValueError(f"table {t.name}: only a declared feature's table can be shared (also)")
            if t.feature not in BUILTIN_TABLE_FEATURES and t.ids != "hashed":
                raise ValueError(f"table {t.name}: a declared feature's table must be ids='hashed'")
        if not any(f in BEHAVIOUR_FEATURES for f in features):
            raise ValueError(f"DIN needs a behaviour table (one of {BEHAVIOUR_FEATURES})")
        return self

    @classmethod
    def recorded(cls, doc: Mapping[str, Any], **now: Any) -> ModelConfig:
        """The settings a snapshot's manifest or an export's contract recorded, as this release reads them.

        A setting from before a setting existed takes `MODEL_SETTINGS_BEFORE`; one (or a table's
        field) that a later release added is left out (`unknown` names them), as a manifest's
        unknown fields are, so a rolled-back release still serves and exports what the later one
        wrote: tensors that do not fit this release's model are refused where they are loaded.
        ``now`` overrides (the device a process runs on).
        """
        known, _ = _split_known({**MODEL_SETTINGS_BEFORE, **doc})
        return cls.model_validate({**known, **now})

    @staticmethod
    def unknown(doc: Mapping[str, Any]) -> list[str]:
        """The recorded settings (``tables[i].field`` for a table's) that `recorded` leaves out."""
        return _split_known(doc)[1]

    @staticmethod
    def as_written(doc: Mapping[str, Any]) -> dict[str, Any]:
        """Each recorded setting as this release writes it (`model_dump`'s JSON), to compare with one.

        A setting from before it existed takes `MODEL_SETTINGS_BEFORE`, and a release before a
        field of a setting existed (a table's ``also``) did not record it, so the setting takes the
        field's default. Unlike `recorded`, which leaves them out, a value this release no longer
        accepts and a setting it does not have are kept as recorded: they differ from any of today's.
        """
        return {key: _as_written(key, value) for key, value in {**MODEL_SETTINGS_BEFORE, **doc}.items()}

    def table(self, feature: Feature) -> TableConfig | None:
        """The table embedding ``feature``, if any."""
        return next((t for t in self.tables if feature in (t.feature, *t.also)), None)

    @property
    def builtin_tables(self) -> tuple[TableConfig, ...]:
        """The tables of the event contract's features (item, category, user), in order."""
        return tuple(t for t in self.tables if t.feature in BUILTIN_TABLE_FEATURES)


def _split_known(doc: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A recorded model section's settings this release knows, and the names of those it does not."""
    known: dict[str, Any] = {k: v for k, v in doc.items() if k in ModelConfig.model_fields}
    unknown = [k for k in doc if k not in known]
    tables = known.get("tables")
    if isinstance(tables, (list, tuple)):  # a list as JSON gives it
        fields = TableConfig.model_fields
        known["tables"] = []
        for i, table in enumerate(tables):
            if isinstance(table, dict):
                unknown += [f"tables[{i}].{k}" for k in table if k not in fields]
                table = {k: v for k, v in table.items() if k in fields}
            known["tables"].append(table)
    return known, unknown


def _as_written(key: str, value: Any) -> Any:  # noqa: ANN401 - a recorded setting's value
    """A recorded setting ``key``'s value through its field's type; as recorded if it does not validate."""
    field = ModelConfig.model_fields.get(key)
    if field is None or field.annotation is None:
        return value
    adapter: TypeAdapter[Any] = TypeAdapter(field.annotation)
    try:
        return adapter.dump_python(adapter.validate_python(value), mode="json")
    except ValidationError:
        return value
