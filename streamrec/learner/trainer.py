"""What every table model's learner shares: training, scoring and the whole state as arrays.

`TableLearner` trains and scores a ``paddle.nn.Layer`` over `ModelConfig.tables` (the id maps,
id statistics, known items; the training passes, lazy Adam and online EWC are
`MiniBatchSteps`, in `streamrec.learner.steps`; the state round trip is `StateArrays`, in
`streamrec.learner.state_arrays`) and the declared features
(`FeatureSchema`: their `FeaturePlan`, encoded columns, standardize moments, and a snapshot
adopted under added features); a model type is a subclass that builds its model
(`DINLearner`, `DeepFMLearner`). The model takes ``(inputs, dense)``: every feature's input
in `FeaturePlan` order (`model_columns`) and the id statistics; it returns [B] logits and
names its tables ``embedding`` (an `EmbeddingArch`) and its per-id biases ``wide``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping

import numpy as np
import paddle

from streamrec.config import ModelConfig, TableConfig
from streamrec.errors import ConfigError
from streamrec.features import FeatureSchema
from streamrec.learner.base import TrainResult
from streamrec.learner.columns import (
    ColumnKeys,
    EncodedColumns,
    SampleColumns,
    column_keys,
    encode,
    hashed_rows,
    require_columns,
)
from streamrec.learner.features import FeaturePlan, Moments, encode_features, feature_values
from streamrec.learner.hashing import PADDING_BUCKET
from streamrec.learner.idmap import DEFAULT_ROW, Admission, IdMap
from streamrec.learner.idstats import IdStats
from streamrec.learner.model import ClickTrain
from streamrec.learner.numpy_attention import one_blas_thread
from streamrec.learner.optimizers import acyclic
from streamrec.learner.ranks import GroupLayout, RankShare
from streamrec.learner.state import (
    OPTIMIZER_PREFIX,
    create_optimizer_slots,
    distinct_rows,
    make_ewc,
    table_of,
    table_params,
)
from streamrec.learner.state_arrays import StateArrays
from streamrec.learner.steps import MiniBatchSteps

# Sparse (row) embedding gradients with lazy Adam: a step updates only the rows a mini-batch
# looked up (and their moments; rows not looked up keep theirs undecayed, the usual choice
# for large recommender tables). Dense gradients materialise and rewrite the whole 2^20 x D
# table and both moments every step: measured on CPU (D=16, T=50, mini-batch 256) dense ran
# ~1,800 samples/s against ~5,000 for sparse.
SPARSE_EMBEDDINGS = True

# Predictions run without a graph, so a chunk can be several training mini-batches large; but
# not many: the attention's [chunk * T, H] tensors must stay in the CPU's caches. Measured
# (default DIN, T = 50, mini-batch 256): 37.6 µs a sample at 4 mini-batches a chunk, 19.0 at 2,
# 20.8 at 1.
_PREDICT_CHUNK_FACTOR = 2

logger = logging.getLogger(__name__)


def resolve_device(name: str) -> str:
    """Map ``auto`` to ``gpu:0`` when Paddle has CUDA and sees a device, else ``cpu``.

    Raises:
        ConfigError: a GPU named where this Paddle is built without CUDA.
    """
    if name.startswith("gpu") and not paddle.device.is_compiled_with_cuda():
        raise ConfigError(
            f"STREAMREC_MODEL__DEVICE={name}: this Paddle is built without CUDA; use auto or cpu "
            "(or install a CUDA build of paddlepaddle-gpu)"
        )
    if name != "auto":
        return name
    if paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0:
        return "gpu:0"
    return "cpu"


class TableLearner(MiniBatchSteps, StateArrays):
    """Trains and scores a table model on micro-batches; its whole state round-trips as numpy arrays.

    "Known" items are the item-table rows the learner has trained on (targets and
    behaviours); without an item table no item counts as known. A subclass builds the model
    (`_make_model`) and says whether it reads the behaviours' per-id biases
    (`MiniBatchSteps.WIDE_ALONG_SEQUENCE`).
    """

    def __init__(
        self, cfg: ModelConfig, rows: Mapping[str, int] | None = None, schema: FeatureSchema | None = None
    ) -> None:
        """Build the model and optimizer, seeded from ``cfg.seed``, on ``cfg.device``.

        Args:
            cfg: The model hyper-parameters.
            rows: Each table's rows to start with (default: what the configuration starts
                with), for a model that trains on batches encoded by another learner.
            schema: The declared features (default: item and category only).

        Raises:
            ConfigError: a table names an undeclared feature (see `FeaturePlan`), or the
                model cannot read a declared feature.
            TypeError: ``cfg`` is not a `ModelConfig`.
        """
        if not isinstance(cfg, ModelConfig):
            raise TypeError(f"cfg must be a ModelConfig (load_config().model, say), not {type(cfg).__name__}")
        self.cfg = cfg
        self.schema = FeatureSchema.default() if schema is None else schema
        self._check_schema(self.schema)
        self.plan = self._plan(cfg, self.schema)
        self.device = resolve_device(cfg.device)
        # Paddle's device is process-global; every learner in a process shares it.
        paddle.device.set_device(self.device)
        paddle.seed(cfg.seed)
        item = cfg.table("item")
        self._item_table = None if item is None else item.name
        # Dynamic tables keep id maps (a declared feature's table is always hashed).
        self._maps = {t.name: IdMap(t) for t in cfg.tables if t.ids == "dynamic"}
        self._ranks: RankShare | None = None  # data-parallel training (`data_parallel`)
        self._build({**self.plan.start_rows, **(rows or {})})
        self._shuffle_seed = cfg.seed
        self._learn_calls = 0
        self._taken = 0  # steps taken since the last micro-batch's close: EWC consolidates them
        # The last batch encoded: scoring and then training the same micro-batch hash it once.
        self._encoded: tuple[SampleColumns, EncodedColumns] | None = None
        self._keys: tuple[SampleColumns, ColumnKeys] | None = None

    @classmethod
    def from_config(cls, cfg: ModelConfig, schema: FeatureSchema | None = None) -> TableLearner:
        """A fresh learner of ``cfg`` reading ``schema``'s features."""
        return cls(cfg, schema=schema)

    def _check_schema(self, schema: FeatureSchema) -> None:
        """Refuse, in one line, declared features the model cannot read (default: none)."""

    def _plan(self, cfg: ModelConfig, schema: FeatureSchema) -> FeaturePlan:
        """The declared features' tables and inputs as this model reads them (default: DIN's)."""
        return FeaturePlan(cfg, schema)

    def _build(self, rows: Mapping[str, int]) -> None:
        """(Re)build everything sized by the tables' rows, freshly initialised.

        Model, optimizer and its slots, EWC, id statistics, known items.
        """
        self.rows = dict(rows)
        self.model = self._make_model(rows)
        self.train_module = ClickTrain(self.model)
        self._sum_gradients = None if self._ranks is None else self._ranks.join(self.train_module)
        self._optimizer = paddle.optimizer.Adam(
            learning_rate=self.cfg.learning_rate,
            parameters=self.train_module.parameters(),
            lazy_mode=SPARSE_EMBEDDINGS,
        )
        acyclic(self._optimizer)
        self._slots = create_optimizer_slots(self._optimizer, self.train_module)
        self._params = list(self.train_module.parameters())
        self._named = dict(self.train_module.named_parameters())
        self._ewc = make_ewc(self.cfg, self.train_module)
        self._stats = IdStats(self.cfg, rows) if self.cfg.id_stats else None
        self._moments = Moments(self.plan.standardized)
        items = 0 if self._item_table is None else rows[self._item_table]
        self.known_items = np.zeros(items, dtype=np.uint8)

    def data_parallel(self, ranks: RankShare) -> None:
        """Train as one of ``ranks.world`` data-parallel ranks (see `streamrec.learner.ranks`).

        Each rank is given its own samples of each group micro-batch (`learn_share`); the ranks
        exchange what the id maps, id statistics and known items count, so those stay alike;
        each trains its own samples of every mini-batch of ``world`` x ``train_batch_size``,
        and the gradients are averaged (`GradientSum`), so all ranks step alike, as one process with a
        ``world`` times larger mini-batch would.
        """
        self._ranks = ranks
        self._sum_gradients = ranks.join(self.train_module)

    @property
    def id_maps(self) -> Mapping[str, IdMap]:
        """The dynamic tables' id maps, by table name."""
        return self._maps

    @property
    def feature_moments(self) -> Mapping[str, np.ndarray]:
        """The standardized features' running moments, float64 [count, mean, m2], by name."""
        return self._moments.arrays

    @property
    def id_stats(self) -> IdStats | None:
        """The id statistics, None when the model reads none."""
        return self._stats

    def _exchange(self, arrays: dict[str, np.ndarray], what: str) -> dict[str, np.ndarray]:
        """The group's ``arrays`` (every rank's, concatenated) when data-parallel, else these."""
        return arrays if self._ranks is None else self._ranks.exchange(arrays, what)

    def encode(self, batch: SampleColumns) -> EncodedColumns:
        """The batch's ids as this model's table rows (cached for the latest batch)."""
        if self._encoded is None or self._encoded[0] is not batch:
            self._encoded = (batch, self._encode(batch, self._batch_keys(batch)))
        return self._encoded[1]

    def _encode(self, batch: SampleColumns, keys: ColumnKeys) -> EncodedColumns:
        encoded = encode(batch, self.cfg, keys, self._rows_of)
        if self._stats is not None:
            dense = self._stats.features(encoded.targets, batch.user_ids)
            encoded = dataclasses.replace(encoded, dense=dense)
        if self.plan.declared:
            extras = encode_features(batch, self.plan, self.cfg.sequence_length, self._moments)
            encoded = dataclasses.replace(encoded, extras=extras)
        return encoded

    def _batch_keys(self, batch: SampleColumns) -> ColumnKeys:
        """The batch's id fingerprints (cached for the latest batch)."""
        if self._keys is None or self._keys[0] is not batch:
            self._keys = (batch, column_keys(batch, self.cfg))
        return self._keys[1]

    def _rows_of(self, table: TableConfig, keys: np.ndarray) -> np.ndarray:
        """A dynamic table's rows from its id map; a hashed table's by hashing."""
        idmap = self._maps.get(table.name)
        return hashed_rows(table, keys) if idmap is None else idmap.lookup(keys)

    def predict_many(self, batch: SampleColumns) -> np.ndarray:
        """Click probabilities, float64 [B], in eval mode without gradients.

        Raises:
            TypeError: ``batch`` is not a `SampleColumns`.
        """
        return self.predict_encoded(self.encode(require_columns(batch)))

    def predict_encoded(self, encoded: EncodedColumns) -> np.ndarray:
        """`predict_many` on an already encoded batch."""
        self.train_module.eval()
        chunk = self.cfg.train_batch_size * _PREDICT_CHUNK_FACTOR
        out = np.empty(len(encoded), dtype=np.float64)
        with paddle.no_grad(), one_blas_thread():  # once here, not in every chunk's forward
            for start in range(0, len(encoded), chunk):
                part = encoded.take(np.arange(start, min(start + chunk, len(encoded))))
                logits = self.model(*self._inputs(part))
                out[start : start + len(part)] = paddle.nn.functional.sigmoid(logits).numpy()
        return out

    def learn_many(self, batch: SampleColumns) -> TrainResult:
        """Train on a labelled batch.

        Train ``cfg.passes`` passes of shuffled mini-batches over ``batch``, then mark its
        items known.

        Returns:
            The mean training loss over every sample of every step taken (NaN for an empty
            batch, or when every step was skipped), and the steps attempted and skipped.
        """
        return self.learn_share(batch, GroupLayout.alone(len(batch)))

    def learn_part(self, batch: SampleColumns) -> TrainResult:
        """`learn_many` on a part of the micro-batch being gathered (`PartLearner`).

        Its ids are admitted and counted, its mini-batches trained; online EWC's anchor and
        Fisher stay the previous micro-batch's until `end_micro_batch` consolidates every
        part's steps at once.
        """
        return self._learn(batch, GroupLayout.alone(len(batch)), close=False)

    def learn_share(self, batch: SampleColumns, layout: GroupLayout) -> TrainResult:
        """`learn_many` on this rank's ``batch`` of a group micro-batch laid out as ``layout``.

        Every rank of the group calls it for each group micro-batch, with its own samples
        (none, perhaps); the loss is this rank's samples' mean.
        """
        return self._learn(batch, layout, close=True)

    def _learn(self, batch: SampleColumns, layout: GroupLayout, close: bool) -> TrainResult:
        """Admit ids, train, count; ``close=False`` leaves the micro-batch open (`learn_part`)."""
        done = self.admit(require_columns(batch))
        first = self._first_moments(batch)
        result = self.learn_encoded(self.encode(batch), layout, close)
        self.count(batch, first)
        return dataclasses.replace(
            result,
            ids_admitted={n: a.admitted for n, a in done.items()},
            ids_evicted={n: a.evicted for n, a in done.items()},
            ids_refused={n: a.refused for n, a in done.items()},
            rows_in_use={n: a.in_use for n, a in done.items()},
        )

    def admit(self, batch: SampleColumns) -> dict[str, Admission]:
        """Let the dynamic tables' id maps see a batch before training on it.

        Evict stale ids, admit those seen often enough (growing a table when it has no free
        row), and reset every row given to a new id.

        Returns:
            What each dynamic table's id map did, by table name.
        """
        if not self._maps:
            return {}
        keys, empty = self._batch_keys(batch), np.zeros(0, np.uint64)
        seen = {"now": batch.ts[:1] if not len(batch) else np.array([batch.ts.max()], np.int64)}
        for name in self._maps:
            seen[f"{name}/targets"] = keys.targets[name]
            seen[f"{name}/mentioned"] = keys.sequences.get(name, empty)
        seen = self._exchange(seen, "admission")  # the group's ids: admitted alike on every rank
        if not len(seen["now"]):
            return {}
        now = int(seen["now"].max())
        done = {
            name: idmap.observe(seen[f"{name}/targets"], seen[f"{name}/mentioned"], now)
            for name, idmap in self._maps.items()
        }
        grown = {name: a.capacity for name, a in done.items() if a.capacity != self.rows[name]}
        if grown:
            self._resize({**self.rows, **grown})
        for name, admission in done.items():
            self._reset_rows(name, admission.rows)
        if any(a.admitted or a.evicted for a in done.values()):
            self._encoded = None  # ids moved between their own rows and the default row
        return done

    def _resize(self, rows: Mapping[str, int]) -> None:
        """Grow tables to ``rows`` without losing anything.

        The state is taken, the new rows appended (zero; a row is reset when an id gets it) and
        everything rebuilt from it.
        """
        logger.info("tables growing %s", " ".join(f"{n}={self.rows[n]}->{r}" for n, r in rows.items()))
        arrays = self.state_arrays()
        padded = {}
        for key, array in arrays.items():
            table = table_of(key, self.cfg)
            if table is not None and rows.get(table, array.shape[0]) != array.shape[0]:
                extra = np.zeros((rows[table] - array.shape[0], *array.shape[1:]), array.dtype)
                array = np.concatenate([array, extra])
            padded[key] = array
        ewc = self._ewc
        self.load_state_arrays(padded)  # rebuilds at the new rows
        if ewc is not None and self._ewc is not None:
            self._ewc.carry(ewc)  # the parts trained so far of a micro-batch in parts

    @paddle.no_grad()
    def _reset_rows(self, table: str, rows: np.ndarray) -> None:
        """Give rows to new ids.

        The weights start as the default row's (what the id used until now), with no optimizer
        or EWC state, no id statistics, not known.
        """
        if not len(rows):
            return
        index = paddle.to_tensor(rows)
        for name in table_params(table, self._named):
            param = self._named[name]
            start = param[DEFAULT_ROW].unsqueeze(0).tile([len(rows), *([1] * (param.ndim - 1))])
            paddle.scatter_(param, index, start)
            for slot in ("moment1", "moment2"):
                moment = self._slots[f"{OPTIMIZER_PREFIX}{name}/{slot}"]
                paddle.scatter_(moment, index, paddle.zeros_like(start))
            if self._ewc is not None:
                self._ewc.reset_rows(name, rows)
        if self._stats is not None and table in self._stats.samples:
            self._stats.reset(table, rows)
        if table == self._item_table:
            self.known_items[rows] = 0

    def _first_moments(self, batch: SampleColumns) -> frozenset[str]:
        """Give the standardized features without moments the batch's (the group's), before training.

        Such a feature read as absent while the batch was scored (`Moments.standardize`);
        trained on raw values, a year added to a running learner trained its first
        micro-batch at loss 735. Returns the features given moments: `count` leaves them.
        """
        empty = [name for name, (n, _, _) in self._moments.arrays.items() if not n]
        if not empty:  # every rank alike: the moments are the group's
            return frozenset()
        values = {name: feature_values(batch, self.plan, name).astype(np.float64) for name in empty}
        values = self._exchange(values, "first moments")
        for name in empty:
            self._moments.update(name, values[name])
        first = frozenset(name for name in empty if self._moments.arrays[name][0])
        if first and self._encoded is not None and self._encoded[0] is batch:  # scored: re-read them
            extras = encode_features(batch, self.plan, self.cfg.sequence_length, self._moments)
            self._encoded = (batch, dataclasses.replace(self._encoded[1], extras=extras))
        return first

    def count(self, batch: SampleColumns, first: frozenset[str] = frozenset()) -> None:
        """Count a batch into the id statistics and mark its items known.

        Add a batch to the id statistics and mark its items known (after training on it:
        a micro-batch's own labels never feed its scores). ``first``: standardized features
        whose moments already hold the batch (`_first_moments`).
        """
        encoded = self.encode(batch)
        counted: dict[str, np.ndarray] = {}
        if self._stats is not None:
            counted |= {f"stats/{name}": rows for name, rows in encoded.targets.items()}
            counted["stats/users"] = IdStats.user_rows(batch.user_ids)
            counted["stats/labels"] = encoded.label.astype(np.float64)
        moments = [name for name in self._moments.arrays if name not in first]
        for name in moments:
            counted[f"moments/{name}"] = feature_values(batch, self.plan, name).astype(np.float64)
        if self._item_table is not None:
            item = self._item_table
            counted["known"] = np.concatenate([encoded.targets[item], encoded.sequences[item].ravel()])
            if self._ranks is not None and self._ranks.world > 1:  # a tenth as many to exchange
                counted["known"] = distinct_rows(counted["known"], len(self.known_items))
        counted = self._exchange(counted, "counts")  # the group's: counted alike on every rank
        if self._stats is not None:
            targets = {name: counted[f"stats/{name}"] for name in encoded.targets}
            self._stats.count_rows(targets, counted["stats/users"], counted["stats/labels"])
        for name in moments:
            self._moments.update(name, counted[f"moments/{name}"])
        if self._item_table is not None and len(counted["known"]):
            self.known_items[counted["known"]] = 1
            self.known_items[PADDING_BUCKET] = 0
            if self._item_table in self._maps:  # the default row is no item's own
                self.known_items[DEFAULT_ROW] = 0
        if self._stats is not None or self._moments.arrays:
            self._encoded = None  # its id statistics and feature moments were read before these counts

    def is_known(self, batch: SampleColumns) -> np.ndarray:
        """Bool [B]: whether each target's item row was trained on before."""
        require_columns(batch)
        if self._item_table is None:
            return np.zeros(len(batch), dtype=bool)
        return self.known_items[self.encode(batch).targets[self._item_table]].astype(bool)

    def _make_model(self, rows: Mapping[str, int]) -> paddle.nn.Layer:
        """The model, freshly initialised, with ``rows`` rows per table."""
        raise NotImplementedError

