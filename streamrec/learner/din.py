"""The DIN learner: device choice, seeded training in mini-batches, scoring, and its full state.

`DINLearner` implements `Learner`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import paddle

from streamrec.config import ModelConfig, TableConfig
from streamrec.errors import SnapshotError
from streamrec.features import FeatureSchema
from streamrec.learner.base import TrainResult
from streamrec.learner.batch import Batch, BatchKeys, EncodedBatch, batch_keys, encode, hashed_rows
from streamrec.learner.ewc import OnlineEWC
from streamrec.learner.features import FeaturePlan, Moments, encode_features, feature_values
from streamrec.learner.hashing import PADDING_BUCKET
from streamrec.learner.idmap import DEFAULT_ROW, Admission, IdMap
from streamrec.learner.idstats import IdStats
from streamrec.learner.model import DIN, DINTrain

# Sparse (row) embedding gradients with lazy Adam: a step updates only the rows a mini-batch
# looked up (and their moments; rows not looked up keep theirs undecayed, the usual choice
# for large recommender tables). Dense gradients materialise and rewrite the whole 2^20 x D
# table and both moments every step: measured on CPU (D=16, T=50, mini-batch 256) dense ran
# ~1,800 samples/s against ~5,000 for sparse.
SPARSE_EMBEDDINGS = True

# Predictions run without a graph, so a chunk can be several training mini-batches large.
_PREDICT_CHUNK_FACTOR = 4

# State-array keys, ``<snapshot file>/<name>``: structured names, never Paddle's process-local
# unique names.
PARAM_PREFIX = "model/"
OPTIMIZER_PREFIX = "optimizer/"
KNOWN_ITEMS_KEY = "state/known_items"
# int64[2]: the shuffle seed and the learn_many call count that, together, seed the next shuffle.
SHUFFLE_KEY = "state/shuffle"
# The id statistics the model reads: serving needs them, so they go with the weights.
STATS_PREFIX = "model/stats/"
# Online EWC's Fisher estimates and anchors (training state only: serving never reads them).
EWC_PREFIX = "ewc/"
# The dynamic tables' id -> row maps: serving needs them to turn ids into rows.
IDS_PREFIX = "model/ids/"
# Standardized features' running moments: serving needs them, so they go with the weights.
FEATURES_PREFIX = "model/features/"
_EMBEDDING = "model.embedding.tables.{}.weight"
_WIDE = "model.wide.biases.{}.weight"
# Arrays whose first axis is a table's rows: its parameters, their Adam moments, their EWC
# state (``beta*_pow_acc`` slots are scalars).
_TABLE_ARRAY = re.compile(
    r"model\.(embedding\.tables|wide\.biases)\.([a-z][a-z0-9_]*)\.weight(/moment[12])?$"
)

# Paddle names an accumulator ``<param unique name>_<slot>_<n>``; ``_<n>`` is the counter.
_UNIQUE_SUFFIX = re.compile(r"_\d+$")

logger = logging.getLogger(__name__)


def resolve_device(name: str) -> str:
    """Map ``auto`` to ``gpu:0`` when Paddle has CUDA and sees a device, else ``cpu``."""
    if name != "auto":
        return name
    if paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0:
        return "gpu:0"
    return "cpu"


class DINLearner:
    """Trains and scores a DIN on micro-batches; its whole state round-trips as numpy arrays.

    "Known" items are the item-table rows the learner has trained on (targets and
    behaviours); without an item table no item counts as known.

    Examples:
        A tiny model, scored before and after it trains on one micro-batch (prequential, as
        the learner loop does):

        >>> from streamrec.config import ModelConfig, TableConfig
        >>> from streamrec.samples import Sample
        >>> cfg = ModelConfig(
        ...     tables=(TableConfig(name="item", feature="item", rows=64, dim=4),),
        ...     attention_units=(8,), mlp_units=(8,), device="cpu",
        ... )
        >>> learner = DINLearner(cfg)
        >>> batch = Batch.from_samples([
        ...     Sample("e1", "u1", 1_700_000_000_000, "i1", "c1", 1, ("i2",), ("c1",)),
        ...     Sample("e1~n0", "u1", 1_700_000_000_000, "i3", "c2", 0, ("i2",), ("c1",)),
        ... ])
        >>> learner.predict_many(batch).shape, learner.is_known(batch)
        ((2,), array([False, False]))
        >>> result = learner.learn_many(batch)
        >>> result.steps, result.ids_admitted
        (1, {'item': 2})
        >>> for _ in range(20):
        ...     _ = learner.learn_many(batch)
        >>> scores = learner.predict_many(batch)
        >>> bool(scores[0] > scores[1])
        True

        Its whole state is named numpy arrays, which a snapshot stores:

        >>> state = learner.state_arrays()
        >>> DINLearner(cfg).load_state_arrays(state)
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
            ConfigError: a table names an undeclared feature (see `FeaturePlan`).
        """
        self.cfg = cfg
        self.schema = FeatureSchema.default() if schema is None else schema
        self.plan = FeaturePlan(cfg, self.schema)
        self.device = resolve_device(cfg.device)
        # Paddle's device is process-global; every learner in a process shares it.
        paddle.device.set_device(self.device)
        paddle.seed(cfg.seed)
        item = cfg.table("item")
        self._item_table = None if item is None else item.name
        self._maps = {t.name: IdMap(t) for t in cfg.builtin_tables if t.ids == "dynamic"}
        self._build(dict(rows) if rows is not None else {t.name: t.start_rows for t in cfg.builtin_tables})
        self._shuffle_seed = cfg.seed
        self._learn_calls = 0
        # The last batch encoded: scoring and then training the same micro-batch hash it once.
        self._encoded: tuple[Batch, EncodedBatch] | None = None
        self._keys: tuple[Batch, BatchKeys] | None = None

    @classmethod
    def from_config(cls, cfg: ModelConfig, schema: FeatureSchema | None = None) -> DINLearner:
        """A fresh learner of ``cfg`` reading ``schema``'s features."""
        return cls(cfg, schema=schema)

    def _build(self, rows: Mapping[str, int]) -> None:
        """(Re)build everything sized by the tables' rows, freshly initialised.

        Model, optimizer and its slots, EWC, id statistics, known items.
        """
        self.rows = dict(rows)
        self.model = DIN(self.cfg, sparse=SPARSE_EMBEDDINGS, rows=rows, plan=self.plan)
        self.train_module = DINTrain(self.model)
        self._optimizer = paddle.optimizer.Adam(
            learning_rate=self.cfg.learning_rate,
            parameters=self.train_module.parameters(),
            lazy_mode=SPARSE_EMBEDDINGS,
        )
        self._slots = _create_optimizer_slots(self._optimizer, self.train_module)
        self._params = list(self.train_module.parameters())
        self._named = dict(self.train_module.named_parameters())
        self._ewc = _make_ewc(self.cfg, self.train_module)
        self._stats = IdStats(self.cfg, rows) if self.cfg.id_stats else None
        self._moments = Moments(self.plan.standardized)
        items = 0 if self._item_table is None else rows[self._item_table]
        self.known_items = np.zeros(items, dtype=np.uint8)

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

    def encode(self, batch: Batch) -> EncodedBatch:
        """The batch's ids as this model's table rows (cached for the latest batch)."""
        if self._encoded is None or self._encoded[0] is not batch:
            encoded = encode(batch, self.cfg, self._batch_keys(batch), self._rows_of)
            if self._stats is not None:
                dense = self._stats.features(encoded.targets, batch.user_ids)
                encoded = dataclasses.replace(encoded, dense=dense)
            if self.plan.sequence or self.plan.head:
                extras = encode_features(batch, self.plan, self.cfg.sequence_length, self._moments)
                encoded = dataclasses.replace(encoded, extras=extras)
            self._encoded = (batch, encoded)
        return self._encoded[1]

    def _batch_keys(self, batch: Batch) -> BatchKeys:
        """The batch's id fingerprints (cached for the latest batch)."""
        if self._keys is None or self._keys[0] is not batch:
            self._keys = (batch, batch_keys(batch, self.cfg))
        return self._keys[1]

    def _rows_of(self, table: TableConfig, keys: np.ndarray) -> np.ndarray:
        """A dynamic table's rows from its id map; a hashed table's by hashing."""
        idmap = self._maps.get(table.name)
        return hashed_rows(table, keys) if idmap is None else idmap.lookup(keys)

    def predict_many(self, batch: Batch) -> np.ndarray:
        """Click probabilities, float64 [B], in eval mode without gradients."""
        return self.predict_encoded(self.encode(batch))

    def predict_encoded(self, encoded: EncodedBatch) -> np.ndarray:
        """`predict_many` on an already encoded batch."""
        self.train_module.eval()
        chunk = self.cfg.train_batch_size * _PREDICT_CHUNK_FACTOR
        out = np.empty(len(encoded), dtype=np.float64)
        with paddle.no_grad():
            for start in range(0, len(encoded), chunk):
                part = encoded.take(np.arange(start, min(start + chunk, len(encoded))))
                logits = self.model(*self._inputs(part))
                out[start : start + len(part)] = paddle.nn.functional.sigmoid(logits).numpy()
        return out

    def learn_many(self, batch: Batch) -> TrainResult:
        """Train on a labelled batch.

        Train ``cfg.passes`` passes of shuffled mini-batches over ``batch``, then mark its
        items known.

        Returns:
            The mean training loss over every sample of every step taken (NaN for an empty
            batch, or when every step was skipped), and the steps attempted and skipped.
        """
        done = self.admit(batch)
        result = self.learn_encoded(self.encode(batch))
        self.count(batch)
        return dataclasses.replace(
            result,
            ids_admitted={n: a.admitted for n, a in done.items()},
            ids_evicted={n: a.evicted for n, a in done.items()},
            ids_refused={n: a.refused for n, a in done.items()},
            rows_in_use={n: a.in_use for n, a in done.items()},
        )

    def admit(self, batch: Batch) -> dict[str, Admission]:
        """Let the dynamic tables' id maps see a batch before training on it.

        Evict stale ids, admit those seen often enough (growing a table when it has no free
        row), and reset every row given to a new id.

        Returns:
            What each dynamic table's id map did, by table name.
        """
        if not self._maps or not len(batch):
            return {}
        keys, now = self._batch_keys(batch), int(batch.ts.max())
        empty = np.zeros(0, np.uint64)
        done = {
            name: idmap.observe(keys.targets[name], keys.sequences.get(name, empty), now)
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
            table = _table_of(key, self.cfg)
            if table is not None and rows.get(table, array.shape[0]) != array.shape[0]:
                extra = np.zeros((rows[table] - array.shape[0], *array.shape[1:]), array.dtype)
                array = np.concatenate([array, extra])
            padded[key] = array
        self.load_state_arrays(padded)  # rebuilds at the new rows

    @paddle.no_grad()
    def _reset_rows(self, table: str, rows: np.ndarray) -> None:
        """Give rows to new ids.

        The weights start as the default row's (what the id used until now), with no optimizer
        or EWC state, no id statistics, not known.
        """
        if not len(rows):
            return
        index = paddle.to_tensor(rows)
        for name in _table_params(table, self._named):
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

    def count(self, batch: Batch) -> None:
        """Count a batch into the id statistics and mark its items known.

        Add a batch to the id statistics and mark its items known (after training on it:
        a micro-batch's own labels never feed its scores).
        """
        encoded = self.encode(batch)
        if self._stats is not None:
            self._stats.count(encoded.targets, batch.user_ids, encoded.label)
        for name in self._moments.arrays:
            self._moments.update(name, feature_values(batch, self.plan, name))
        if self._item_table is not None and len(encoded):
            self.known_items[encoded.targets[self._item_table]] = 1
            self.known_items[encoded.sequences[self._item_table].ravel()] = 1
            self.known_items[PADDING_BUCKET] = 0
            if self._item_table in self._maps:  # the default row is no item's own
                self.known_items[DEFAULT_ROW] = 0

    def learn_encoded(self, encoded: EncodedBatch) -> TrainResult:
        """The training passes of `learn_many` on an already encoded batch."""
        if len(encoded) == 0:
            return TrainResult()
        self.train_module.train()
        # Seeded by (seed, call count), both in state_arrays, so a restored learner shuffles
        # the next batch exactly as the original would have.
        rng = np.random.default_rng([self._shuffle_seed, self._learn_calls])
        size = self.cfg.train_batch_size
        total = paddle.zeros([], dtype="float32")
        penalties = paddle.zeros([], dtype="float32")
        trained = steps = skipped = 0
        for _ in range(self.cfg.passes):
            order = rng.permutation(len(encoded))
            for start in range(0, len(encoded), size):
                part = encoded.take(order[start : start + size])
                losses = self._step(part)
                steps += 1
                if losses is None:
                    skipped += 1
                    continue
                total += losses[0] * len(part)
                penalties += losses[1] * len(part)
                trained += len(part)
        self._learn_calls += 1
        if self._ewc is not None:
            self._ewc.consolidate(steps - skipped)
        if not trained:
            return TrainResult(math.nan, steps, skipped)
        return TrainResult(float(total) / trained, steps, skipped, float(penalties) / trained)

    def _step(self, part: EncodedBatch) -> tuple[paddle.Tensor, paddle.Tensor] | None:
        """One optimizer step on a mini-batch.

        Its data loss and EWC penalty, or None, with the weights and the optimizer's state
        untouched, when the loss or a gradient is not finite.

        The penalty's gradient is added after the data loss's gradients went into the Fisher
        estimate: EWC measures what the data says, not its own pull.
        """
        loss = self.train_module(*self._inputs(part), paddle.to_tensor(part.label))
        loss.backward()
        penalty = None
        finite = _all_finite([loss, *(p.grad for p in self._params if p.grad is not None)])
        if finite and self._ewc is not None:
            self._ewc.accumulate()
            penalty = self._ewc.penalty(self._looked_up(part))
            if penalty is not None:
                penalty.backward()
        if finite:
            self._optimizer.step()
        self._optimizer.clear_grad()
        if not finite:
            return None
        return loss.detach(), (paddle.zeros([]) if penalty is None else penalty.detach())

    def _looked_up(self, part: EncodedBatch) -> dict[str, paddle.Tensor]:
        """The rows each sparse parameter looks up in a mini-batch.

        The rows of each sparse parameter a mini-batch looks up (padding left out), by
        structured parameter name.
        """
        rows: dict[str, paddle.Tensor] = {}
        for name in self.model.embedding.behaviour:
            ids = np.concatenate([part.targets[name], part.sequences[name].ravel()])
            rows[f"model.embedding.tables.{name}.weight"] = _unique_rows(ids)
            rows[f"model.wide.biases.{name}.weight"] = _unique_rows(part.targets[name])
        for name in self.model.embedding.context:
            rows[f"model.embedding.tables.{name}.weight"] = _unique_rows(part.context[name])
            rows[f"model.wide.biases.{name}.weight"] = rows[f"model.embedding.tables.{name}.weight"]
        looked: dict[str, list[np.ndarray]] = {}
        for key, array in part.extras.items():
            feature = self.plan.schema[key.split("/")[0]]
            table = self.plan.table_of(feature.name)
            if table is not None:
                looked.setdefault(table, []).append(array.ravel())
        for table in self.plan.tables:
            parts = looked.get(table, [np.zeros(0, np.int64)])
            rows[f"model.embedding.tables.{table}.weight"] = _unique_rows(np.concatenate(parts))
        return rows

    def is_known(self, batch: Batch) -> np.ndarray:
        """Bool [B]: whether each target's item row was trained on before."""
        if self._item_table is None:
            return np.zeros(len(batch), dtype=bool)
        return self.known_items[self.encode(batch).targets[self._item_table]].astype(bool)

    def state_arrays(self) -> dict[str, np.ndarray]:
        """Everything needed to resume training: parameters, Adam slots, known items, shuffle.

        Keys are structured names (``model/model.embedding.tables.item.weight``,
        ``optimizer/model.embedding.tables.item.weight/moment1``), stable across processes.
        """
        arrays = {
            PARAM_PREFIX + name: tensor.numpy()
            for name, tensor in self.train_module.state_dict().items()
        }
        arrays.update({key: tensor.numpy() for key, tensor in self._slots.items()})
        arrays[KNOWN_ITEMS_KEY] = self.known_items.copy()
        arrays[SHUFFLE_KEY] = np.array([self._shuffle_seed, self._learn_calls], dtype=np.int64)
        if self._stats is not None:
            arrays.update(self._stats.state_arrays(STATS_PREFIX))
        arrays.update(self._moments.state_arrays(FEATURES_PREFIX))
        if self._ewc is not None:
            arrays.update(self._ewc.state_arrays(EWC_PREFIX))
        for name, idmap in self._maps.items():
            arrays.update(idmap.state_arrays(f"{IDS_PREFIX}{name}/"))
        return arrays

    def load_state_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Restore the state ``state_arrays`` returned, from this or another process.

        EWC state is the one exception to an exact fit, so that EWC can be switched on or off
        across a restart: state saved without it starts EWC afresh (anchored at the restored
        weights, no Fisher mass yet), and saved EWC state is ignored when EWC is off.

        Dynamic tables take the rows the state has (the learner grows or shrinks to them).

        Raises:
            SnapshotError: If a key is missing or unexpected, an array has the wrong shape,
                or an id map is inconsistent.
        """
        rows = self._rows_in(arrays)
        if rows != self.rows:
            self._build(rows)
        params = {PARAM_PREFIX + n: t for n, t in self.train_module.state_dict().items()}
        targets = {**params, **self._slots}
        stats = {} if self._stats is None else self._stats.state_arrays(STATS_PREFIX)
        stats.update(self._moments.state_arrays(FEATURES_PREFIX))
        ewc = {k: a for k, a in arrays.items() if k.startswith(EWC_PREFIX)}
        ids = {k: a for k, a in arrays.items() if k.startswith(IDS_PREFIX)}
        arrays = {k: a for k, a in arrays.items() if not k.startswith((EWC_PREFIX, IDS_PREFIX))}
        _check_exact(ids, {k: a[:0] for k, a in self._ids_state().items()}, "id map", shapes=False)
        expected = {*targets, *stats, KNOWN_ITEMS_KEY, SHUFFLE_KEY}
        if set(arrays) != expected:
            missing, extra = sorted(expected - set(arrays)), sorted(set(arrays) - expected)
            raise SnapshotError(
                f"state arrays do not fit this model: missing={missing} extra={extra}"
            )
        for key, tensor in targets.items():
            _check_shape(key, arrays[key], tuple(tensor.shape))
        _check_shape(KNOWN_ITEMS_KEY, arrays[KNOWN_ITEMS_KEY], self.known_items.shape)
        _check_shape(SHUFFLE_KEY, arrays[SHUFFLE_KEY], (2,))
        for key, array in stats.items():
            _check_shape(key, arrays[key], array.shape)
        if self._ewc is not None and ewc:
            _check_exact(ewc, self._ewc.state_arrays(EWC_PREFIX), "EWC")
        for key, tensor in targets.items():
            tensor.set_value(np.ascontiguousarray(arrays[key], dtype=_numpy_dtype(tensor)))
        self.known_items = np.asarray(arrays[KNOWN_ITEMS_KEY], dtype=np.uint8).copy()
        self._shuffle_seed, self._learn_calls = (int(v) for v in arrays[SHUFFLE_KEY])
        if self._stats is not None:
            self._stats.load_state_arrays(arrays, STATS_PREFIX)
        self._moments.load_state_arrays(arrays, FEATURES_PREFIX)
        self._ewc = _make_ewc(self.cfg, self.train_module)  # anchored at the new weights
        if self._ewc is not None and ewc:
            self._ewc.load_state_arrays(ewc, EWC_PREFIX)
        for name, idmap in self._maps.items():
            try:
                idmap.load_state_arrays(ids, f"{IDS_PREFIX}{name}/", rows[name])
            except ValueError as exc:
                raise SnapshotError(f"id map of table {name} is inconsistent: {exc}") from exc
        self._encoded = None

    def adopt_state(self, arrays: Mapping[str, np.ndarray], recorded: FeatureSchema) -> dict[str, np.ndarray]:
        """State saved under ``recorded`` (fewer declared features), made to fit this model.

        Call on a fresh learner. The added features' tables (and moments) start as this
        learner's; the two layers that read every feature (attention's first, the head's
        first) get zero weights for the new inputs, so the model scores as before until it
        learns them. EWC state is left out (it restarts, as `load_state_arrays` allows).
        """
        added = [n for n in self.schema.names if n not in recorded]
        if not added:
            return dict(arrays)
        fresh = self.state_arrays()
        owned = tuple(f"tables.{self.plan.table_of(n)}." for n in added if self.plan.table_of(n)) + tuple(
            f"{FEATURES_PREFIX}{n}/" for n in added
        )
        old, new = self._layouts(recorded), self._layouts(self.schema)
        out: dict[str, np.ndarray] = {}
        for key, start in fresh.items():
            if key.startswith(EWC_PREFIX):
                continue
            saved = arrays.get(key)
            layer = next((layer for layer in new if f"model.{layer}.weight" in key), None)
            if saved is None and any(o in key for o in owned):
                out[key] = start
            elif saved is not None and layer is not None and saved.shape != start.shape:
                out[key] = _widen(saved, old[layer], new[layer])
            elif saved is not None:
                out[key] = saved
        out.update({k: v for k, v in arrays.items() if k not in fresh and not k.startswith(EWC_PREFIX)})
        return out

    def _layouts(self, schema: FeatureSchema) -> dict[str, list[tuple[str, int]]]:
        """The input columns of the layers reading every feature, as (segment, width), under ``schema``."""
        known = [f for f in (*self.plan.sequence, *self.plan.head) if f.name in schema]
        query = [(f.name, f.width) for f in known if f.query]
        outcome = [(f.name, f.width) for f in known if f.spec.outcome]
        head = [(f.name, f.width) for f in known if f.spec.role != "behaviour"]
        vector = [("builtin", self.model.embedding.behaviour_dim), *query, *outcome]
        match = 0 if self.model.match is None else self.model.match.width
        return {
            "attention.score.0": [(f"{b}:{n}", w) for b in "qkdp" for n, w in vector],
            "head.mlp.0": [
                *((f"{b}:{n}", w) for b in "tip" for n, w in vector),
                ("context", self.model.embedding.context_dim), *head,
                ("dense", self.model.dense_dim), ("match", match),
            ],
        }

    def _ids_state(self) -> dict[str, np.ndarray]:
        """The id maps' state arrays."""
        out: dict[str, np.ndarray] = {}
        for name, idmap in self._maps.items():
            out.update(idmap.state_arrays(f"{IDS_PREFIX}{name}/"))
        return out

    def _rows_in(self, arrays: Mapping[str, np.ndarray]) -> dict[str, int]:
        """Each table's rows in a state: its embedding's; checked against the configuration."""
        rows = {}
        for name, (n, _) in self.plan.tables.items():
            key = f"{PARAM_PREFIX}{_EMBEDDING.format(name)}"
            if key not in arrays:
                raise SnapshotError(f"state arrays do not fit this model: missing={[key]}")
            if int(arrays[key].shape[0]) != n:
                raise SnapshotError(
                    f"table {name} has {arrays[key].shape[0]} rows in the state; this model has {n}"
                )
        for table in self.cfg.builtin_tables:
            key = f"{PARAM_PREFIX}{_EMBEDDING.format(table.name)}"
            if key not in arrays:
                raise SnapshotError(f"state arrays do not fit this model: missing={[key]}")
            n = int(arrays[key].shape[0])
            fits = n == table.rows if table.ids == "hashed" else 3 <= n <= table.rows
            if not fits:
                raise SnapshotError(
                    f"table {table.name} has {n} rows in the state; this model allows "
                    f"{table.rows if table.ids == 'hashed' else f'3..{table.rows}'}"
                )
            rows[table.name] = n
        return rows

    def _inputs(self, encoded: EncodedBatch) -> tuple[list[paddle.Tensor] | paddle.Tensor, ...]:
        """The model's input tensors for an encoded batch.

        The model's id tensors, by kind in table order, and the dense features, on the
        learner's device.
        """
        return (
            [paddle.to_tensor(a) for a in encoded.targets.values()],
            [paddle.to_tensor(a) for a in encoded.sequences.values()],
            [paddle.to_tensor(a) for a in encoded.context.values()],
            paddle.to_tensor(encoded.dense),
            [paddle.to_tensor(encoded.extras[k]) for k in self.plan.input_keys],
        )


def _table_params(table: str, named: Mapping[str, paddle.Tensor]) -> list[str]:
    """The structured names of a table's parameters: its embedding and its wide bias."""
    return [n for n in (_EMBEDDING.format(table), _WIDE.format(table)) if n in named]


def _table_of(key: str, cfg: ModelConfig) -> str | None:
    """The table whose rows a state array's first axis follows, if any."""
    match = _TABLE_ARRAY.search(key)
    if match:
        return match.group(2)
    stats = key.removeprefix(STATS_PREFIX).split("/")
    if key.startswith(STATS_PREFIX) and any(t.name == stats[0] for t in cfg.builtin_tables):
        return stats[0]
    item = cfg.table("item")
    return item.name if key == KNOWN_ITEMS_KEY and item is not None else None


def _widen(array: np.ndarray, old: list[tuple[str, int]], new: list[tuple[str, int]]) -> np.ndarray:
    """A first layer's [in, H] array for the ``new`` input layout: old rows kept, new ones zero."""
    out = np.zeros((sum(w for _, w in new), *array.shape[1:]), array.dtype)
    starts, at = {}, 0
    for name, width in new:
        starts[name], at = at, at + width
    at = 0
    for name, width in old:
        out[starts[name] : starts[name] + width] = array[at : at + width]
        at += width
    return out


def _make_ewc(cfg: ModelConfig, module: paddle.nn.Layer) -> OnlineEWC | None:
    """Online EWC over every trainable parameter, or None when ``cfg.ewc_lambda`` is 0."""
    if cfg.ewc_lambda == 0:
        return None
    params = {n: p for n, p in module.named_parameters() if not p.stop_gradient}
    sparse = frozenset(n for n in params if n.startswith(("model.embedding.", "model.wide.")))
    return OnlineEWC(params, sparse, cfg.ewc_lambda, cfg.ewc_gamma, cfg.ewc_normalise)


def _unique_rows(ids: np.ndarray) -> paddle.Tensor:
    """The distinct row ids in ``ids``, padding left out, as an int64 tensor."""
    rows = np.unique(ids)
    return paddle.to_tensor(rows[rows != PADDING_BUCKET].astype(np.int64))


def _all_finite(tensors: Sequence[paddle.Tensor]) -> bool:
    """Whether every element of every tensor is finite, in one device-to-host sync.

    A sparse embedding gradient (rows) is checked by its values. The sync per step is the
    price of skipping a poisoned step before it is applied.
    """
    flags = [paddle.isfinite(_dense(t)).all() for t in tensors]
    return bool(paddle.stack(flags).all())


def _dense(tensor: paddle.Tensor) -> paddle.Tensor:
    """The values of a tensor: itself, or a sparse gradient's rows of values."""
    if tensor.is_selected_rows():
        # Private API: Paddle has no public accessor for a SelectedRows gradient's values.
        return tensor._get_tensor_from_selected_rows()
    return tensor


def _create_optimizer_slots(
    optimizer: paddle.optimizer.Adam, module: paddle.nn.Layer
) -> dict[str, paddle.Tensor]:
    """Create Adam's accumulators now and key them by structured parameter name.

    Paddle creates accumulators lazily at the first step and names them after the
    parameters' process-local unique names (``embedding_3.w_0_moment1_0``); creating them up
    front makes the state complete before any training and gives ``load_state_arrays``
    tensors to write into.
    """
    params = dict(module.named_parameters())
    block = paddle.static.default_main_program().global_block()
    # Private API: Paddle has no public way to materialise the accumulators before step().
    optimizer._create_accumulators(block, list(params.values()))
    by_unique = {p.name: name for name, p in params.items()}
    slots: dict[str, paddle.Tensor] = {}
    for var_name, tensor in optimizer.state_dict().items():
        unique, slot = _split_accumulator_name(var_name, by_unique)
        slots[f"{OPTIMIZER_PREFIX}{by_unique[unique]}/{slot}"] = tensor
    return slots


def _split_accumulator_name(var_name: str, uniques: Iterable[str]) -> tuple[str, str]:
    """Split ``linear_2.w_0_moment1_0`` into the parameter's unique name and the slot."""
    for unique in uniques:
        if var_name.startswith(unique + "_"):
            return unique, _UNIQUE_SUFFIX.sub("", var_name[len(unique) + 1 :])
    raise SnapshotError(f"optimizer state {var_name} belongs to no parameter")


def _numpy_dtype(tensor: paddle.Tensor) -> np.dtype:
    """The numpy dtype of a tensor, without copying it (``set_value`` refuses a mismatch)."""
    return paddle.zeros([0], dtype=tensor.dtype).numpy().dtype


def _check_exact(
    arrays: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray], what: str, shapes: bool = True
) -> None:
    """Raise SnapshotError unless ``arrays`` has exactly the keys (and shapes) of ``expected``."""
    if set(arrays) != set(expected):
        missing, extra = sorted(set(expected) - set(arrays)), sorted(set(arrays) - set(expected))
        raise SnapshotError(f"{what} state does not fit this model: missing={missing} extra={extra}")
    for key, array in expected.items() if shapes else ():
        _check_shape(key, arrays[key], array.shape)


def _check_shape(key: str, array: np.ndarray, shape: tuple[int, ...]) -> None:
    """Raise SnapshotError if ``array`` does not have ``shape``."""
    if tuple(array.shape) != shape:
        raise SnapshotError(f"state array {key} has shape {array.shape}, expected {shape}")
