"""The DIN learner: device choice, seeded training in mini-batches, scoring, and its full state.

:class:`DINLearner` implements :class:`~streamrec.learner.base.Learner`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import paddle

from streamrec.config import ModelConfig
from streamrec.errors import SnapshotError
from streamrec.learner.base import TrainResult
from streamrec.learner.batch import Batch, EncodedBatch, encode
from streamrec.learner.hashing import PADDING_BUCKET
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

# Paddle names an accumulator ``<param unique name>_<slot>_<n>``; ``_<n>`` is the counter.
_UNIQUE_SUFFIX = re.compile(r"_\d+$")


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
    """

    def __init__(self, cfg: ModelConfig) -> None:
        """Build the model and optimizer, seeded from ``cfg.seed``, on ``cfg.device``.

        Args:
            cfg: The model hyper-parameters.
        """
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        # Paddle's device is process-global; every learner in a process shares it.
        paddle.device.set_device(self.device)
        paddle.seed(cfg.seed)
        self.model = DIN(cfg, sparse=SPARSE_EMBEDDINGS)
        self.train_module = DINTrain(self.model)
        self._optimizer = paddle.optimizer.Adam(
            learning_rate=cfg.learning_rate,
            parameters=self.train_module.parameters(),
            lazy_mode=SPARSE_EMBEDDINGS,
        )
        self._slots = _create_optimizer_slots(self._optimizer, self.train_module)
        self._params = list(self.train_module.parameters())
        item = cfg.table("item")
        self._item_table = None if item is None else item.name
        self.known_items = np.zeros(0 if item is None else item.buckets, dtype=np.uint8)
        self._shuffle_seed = cfg.seed
        self._learn_calls = 0
        self._stats = IdStats(cfg) if cfg.id_stats else None
        # The last batch encoded: scoring and then training the same micro-batch hash it once.
        self._encoded: tuple[Batch, EncodedBatch] | None = None

    def encode(self, batch: Batch) -> EncodedBatch:
        """The batch hashed into this model's table rows (cached for the latest batch)."""
        if self._encoded is None or self._encoded[0] is not batch:
            encoded = encode(batch, self.cfg)
            if self._stats is not None:
                dense = self._stats.features(encoded.targets, batch.user_ids)
                encoded = dataclasses.replace(encoded, dense=dense)
            self._encoded = (batch, encoded)
        return self._encoded[1]

    def predict_many(self, batch: Batch) -> np.ndarray:
        """Click probabilities, float64 [B], in eval mode without gradients."""
        return self.predict_encoded(self.encode(batch))

    def predict_encoded(self, encoded: EncodedBatch) -> np.ndarray:
        """:meth:`predict_many` on an already encoded batch."""
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
        """Train ``cfg.passes`` passes of shuffled mini-batches over ``batch``, then mark its
        items known.

        Returns:
            The mean training loss over every sample of every step taken (NaN for an empty
            batch, or when every step was skipped), and the steps attempted and skipped.
        """
        result = self.learn_encoded(self.encode(batch))
        self.count(batch)
        return result

    def count(self, batch: Batch) -> None:
        """Add a batch to the id statistics and mark its items known (after training on it:
        a micro-batch's own labels never feed its scores)."""
        encoded = self.encode(batch)
        if self._stats is not None:
            self._stats.count(encoded.targets, batch.user_ids, encoded.label)
        if self._item_table is not None and len(encoded):
            self.known_items[encoded.targets[self._item_table]] = 1
            self.known_items[encoded.sequences[self._item_table].ravel()] = 1
            self.known_items[PADDING_BUCKET] = 0

    def learn_encoded(self, encoded: EncodedBatch) -> TrainResult:
        """The training passes of :meth:`learn_many` on an already encoded batch."""
        if len(encoded) == 0:
            return TrainResult()
        self.train_module.train()
        # Seeded by (seed, call count), both in state_arrays, so a restored learner shuffles
        # the next batch exactly as the original would have.
        rng = np.random.default_rng([self._shuffle_seed, self._learn_calls])
        size = self.cfg.train_batch_size
        total = paddle.zeros([], dtype="float32")
        trained = steps = skipped = 0
        for _ in range(self.cfg.passes):
            order = rng.permutation(len(encoded))
            for start in range(0, len(encoded), size):
                part = encoded.take(order[start : start + size])
                loss = self._step(part)
                steps += 1
                if loss is None:
                    skipped += 1
                    continue
                total += loss * len(part)
                trained += len(part)
        self._learn_calls += 1
        return TrainResult(float(total) / trained if trained else math.nan, steps, skipped)

    def _step(self, part: EncodedBatch) -> paddle.Tensor | None:
        """One optimizer step on a mini-batch: its loss, or None, with the weights and the
        optimizer's state untouched, when the loss or a gradient is not finite."""
        loss = self.train_module(*self._inputs(part), paddle.to_tensor(part.label))
        loss.backward()
        finite = _all_finite([loss, *(p.grad for p in self._params if p.grad is not None)])
        if finite:
            self._optimizer.step()
        self._optimizer.clear_grad()
        return loss.detach() if finite else None

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
        return arrays

    def load_state_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Restore the state ``state_arrays`` returned, from this or another process.

        Raises:
            SnapshotError: If a key is missing or unexpected, or an array has the wrong shape.
        """
        params = {PARAM_PREFIX + n: t for n, t in self.train_module.state_dict().items()}
        targets = {**params, **self._slots}
        stats = {} if self._stats is None else self._stats.state_arrays(STATS_PREFIX)
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
        for key, tensor in targets.items():
            tensor.set_value(np.ascontiguousarray(arrays[key], dtype=_numpy_dtype(tensor)))
        self.known_items = np.asarray(arrays[KNOWN_ITEMS_KEY], dtype=np.uint8).copy()
        self._shuffle_seed, self._learn_calls = (int(v) for v in arrays[SHUFFLE_KEY])
        if self._stats is not None:
            self._stats.load_state_arrays(arrays, STATS_PREFIX)
        self._encoded = None

    def _inputs(self, encoded: EncodedBatch) -> tuple[list[paddle.Tensor] | paddle.Tensor, ...]:
        """The model's id tensors, by kind in table order, and the dense features, on the
        learner's device."""
        return (
            [paddle.to_tensor(a) for a in encoded.targets.values()],
            [paddle.to_tensor(a) for a in encoded.sequences.values()],
            [paddle.to_tensor(a) for a in encoded.context.values()],
            paddle.to_tensor(encoded.dense),
        )


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


def _check_shape(key: str, array: np.ndarray, shape: tuple[int, ...]) -> None:
    """Raise SnapshotError if ``array`` does not have ``shape``."""
    if tuple(array.shape) != shape:
        raise SnapshotError(f"state array {key} has shape {array.shape}, expected {shape}")
