"""The DIN learner: device choice, seeded training in mini-batches, scoring, and its full state."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable

import numpy as np
import paddle

from streamrec.config import ModelConfig
from streamrec.errors import SnapshotError
from streamrec.learner.batch import Batch
from streamrec.learner.hashing import PADDING_BUCKET
from streamrec.learner.model import DIN, DINTrain

# Sparse (row) embedding gradients with lazy Adam: a step updates only the rows a mini-batch
# looked up (and their moments; rows not looked up keep theirs undecayed, the usual choice
# for large recommender tables). Dense gradients materialise and rewrite the whole 2^20 x D
# table and both moments every step: measured on CPU (D=16, T=50, mini-batch 256) dense ran
# ~1,800 samples/s against ~5,000 for sparse.
SPARSE_EMBEDDINGS = True

# Predictions run without a graph, so a chunk can be several training mini-batches large.
_PREDICT_CHUNK_FACTOR = 4

# State-array key prefixes: structured names, never Paddle's process-local unique names.
PARAM_PREFIX = "param/"
OPTIMIZER_PREFIX = "optimizer/"
KNOWN_ITEMS_KEY = "known_items"
# int64[2]: the shuffle seed and the learn_many call count that, together, seed the next shuffle.
SHUFFLE_KEY = "shuffle"

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
    """Trains and scores a DIN on hashed batches; its whole state round-trips as numpy arrays."""

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
        self.known_items = np.zeros(cfg.item_buckets, dtype=np.uint8)
        self._shuffle_seed = cfg.seed
        self._learn_calls = 0

    def predict_many(self, batch: Batch) -> np.ndarray:
        """Click probabilities, float64 [B], in eval mode without gradients."""
        self.train_module.eval()
        chunk = self.cfg.train_batch_size * _PREDICT_CHUNK_FACTOR
        out = np.empty(len(batch), dtype=np.float64)
        with paddle.no_grad():
            for start in range(0, len(batch), chunk):
                part = batch.take(np.arange(start, min(start + chunk, len(batch))))
                logits = self.model(*self._inputs(part))
                out[start : start + len(part)] = paddle.nn.functional.sigmoid(logits).numpy()
        return out

    def learn_many(self, batch: Batch, keepalive: Callable[[], None] | None = None) -> float:
        """Train ``cfg.passes`` passes of shuffled mini-batches over ``batch``.

        Args:
            batch: The labelled samples.
            keepalive: Called after every optimizer step, e.g. to poll Kafka during a long step.

        Returns:
            The mean training loss over every sample of every pass; NaN for an empty batch.
        """
        if len(batch) == 0:
            return math.nan
        self.train_module.train()
        # Seeded by (seed, call count), both in state_arrays, so a restored learner shuffles
        # the next batch exactly as the original would have.
        rng = np.random.default_rng([self._shuffle_seed, self._learn_calls])
        size = self.cfg.train_batch_size
        total = paddle.zeros([], dtype="float32")
        for _ in range(self.cfg.passes):
            order = rng.permutation(len(batch))
            for start in range(0, len(batch), size):
                part = batch.take(order[start : start + size])
                loss = self.train_module(*self._inputs(part), paddle.to_tensor(part.label))
                loss.backward()
                self._optimizer.step()
                self._optimizer.clear_grad()
                total += loss.detach() * len(part)
                if keepalive is not None:
                    keepalive()
        self._learn_calls += 1
        return float(total) / (len(batch) * self.cfg.passes)

    def update_known(self, batch: Batch) -> None:
        """Mark the batch's target and behaviour item buckets as seen."""
        self.known_items[batch.target_item] = 1
        self.known_items[batch.seq_items.ravel()] = 1
        self.known_items[PADDING_BUCKET] = 0

    def is_known(self, batch: Batch) -> np.ndarray:
        """Bool [B]: whether each target item's bucket was seen by ``update_known`` before."""
        return self.known_items[batch.target_item].astype(bool)

    def state_arrays(self) -> dict[str, np.ndarray]:
        """Everything needed to resume training: parameters, Adam slots, known items, shuffle.

        Keys are structured names (``param/model.embedding.item.weight``,
        ``optimizer/model.embedding.item.weight/moment1``), stable across processes.
        """
        arrays = {
            PARAM_PREFIX + name: tensor.numpy()
            for name, tensor in self.train_module.state_dict().items()
        }
        arrays.update({key: tensor.numpy() for key, tensor in self._slots.items()})
        arrays[KNOWN_ITEMS_KEY] = self.known_items.copy()
        arrays[SHUFFLE_KEY] = np.array([self._shuffle_seed, self._learn_calls], dtype=np.int64)
        return arrays

    def load_state_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """Restore the state ``state_arrays`` returned, from this or another process.

        Raises:
            SnapshotError: If a key is missing or unexpected, or an array has the wrong shape.
        """
        params = {PARAM_PREFIX + n: t for n, t in self.train_module.state_dict().items()}
        targets = {**params, **self._slots}
        expected = {*targets, KNOWN_ITEMS_KEY, SHUFFLE_KEY}
        if set(arrays) != expected:
            missing, extra = sorted(expected - set(arrays)), sorted(set(arrays) - expected)
            raise SnapshotError(
                f"state arrays do not fit this model: missing={missing} extra={extra}"
            )
        for key, tensor in targets.items():
            _check_shape(key, arrays[key], tuple(tensor.shape))
        _check_shape(KNOWN_ITEMS_KEY, arrays[KNOWN_ITEMS_KEY], self.known_items.shape)
        _check_shape(SHUFFLE_KEY, arrays[SHUFFLE_KEY], (2,))
        for key, tensor in targets.items():
            tensor.set_value(np.ascontiguousarray(arrays[key], dtype=_numpy_dtype(tensor)))
        self.known_items = np.asarray(arrays[KNOWN_ITEMS_KEY], dtype=np.uint8).copy()
        self._shuffle_seed, self._learn_calls = (int(v) for v in arrays[SHUFFLE_KEY])

    def _inputs(self, batch: Batch) -> tuple[paddle.Tensor, ...]:
        """The model's four id tensors on the learner's device."""
        return (
            paddle.to_tensor(batch.target_item),
            paddle.to_tensor(batch.target_category),
            paddle.to_tensor(batch.seq_items),
            paddle.to_tensor(batch.seq_categories),
        )


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
