"""A table learner's state as named arrays: its keys, and the checks that restore it exactly.

Shared by every learner built on `streamrec.learner.trainer.TableLearner` (DIN, DeepFM):
structured array names, Adam's slots keyed by parameter name, the table a state array's rows
follow, and the one-line `SnapshotError`s a state that does not fit raises.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import paddle

from streamrec.config import BEHAVIOUR_FEATURES, ModelConfig
from streamrec.errors import SnapshotError
from streamrec.learner.ewc import OnlineEWC
from streamrec.learner.hashing import PADDING_BUCKET
from streamrec.snapshots.manifest import STATE_LAYOUT as STATE_LAYOUT  # imported from here too
from streamrec.snapshots.manifest import layout_problem

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
# Every table model names its tables ``embedding.tables.<table>`` and its per-id biases
# ``wide.biases.<table>``: the learner resets, grows and regularises them by these names.
EMBEDDING = "model.embedding.tables.{}.weight"
WIDE = "model.wide.biases.{}.weight"
# Arrays whose first axis is a table's rows: its parameters, their Adam moments, their EWC
# state (``beta*_pow_acc`` slots are scalars).
_TABLE_ARRAY = re.compile(
    r"model\.(embedding\.tables|wide\.biases)\.([a-z][a-z0-9_]*)\.weight(/moment[12])?$"
)

# The state's layout: which arrays a table model's state holds, under which names and shapes.
# A snapshot records it (``state_layout`` in its manifest's configuration; a snapshot without
# one is layout 1) and `migrate_state` brings an older layout's arrays to this one on load.
# 1: the layout before it was recorded; 2: the same arrays, every table (built-in or
# declared) planned and built by one path (`streamrec.learner.features.FeaturePlan`), which
# keeps each table's ``embedding.tables.<table>``/``wide.biases.<table>`` name and the
# parameters' creation order; 3: DIN's wide part covers the declared behaviour features of ids
# (`streamrec.learner.model.biased`), so a DIN with such a feature has a bias table more,
# ``wide.biases.<its table>``, which `StateArrays.adopt_state` starts at zero for an older
# state (a default schema's state, and DeepFM's, are unchanged); 4: the id maps' arrays
# (``model/ids/<table>/``) are by slot, not sorted by key, holes (row -2) included
# (`streamrec.learner.idmap`), so that a delta snapshot carries only the ids that changed.
# STATE_LAYOUT is 4: `streamrec.snapshots.manifest.STATE_LAYOUT`, where a snapshot's readers check it.

# Paddle names an accumulator ``<param unique name>_<slot>_<n>``; ``_<n>`` is the counter.
_UNIQUE_SUFFIX = re.compile(r"_\d+$")


def migrate_state(arrays: Mapping[str, np.ndarray], layout: int) -> dict[str, np.ndarray]:
    """State arrays of state layout ``layout`` (a snapshot's) in this code's, `STATE_LAYOUT`.

    Raises:
        SnapshotError: the layout is newer than this code knows, or not a layout at all.
    """
    problem = layout_problem(layout)
    if problem is not None:
        raise SnapshotError(problem)
    out = dict(arrays)
    for step in range(layout, STATE_LAYOUT):
        out = _MIGRATIONS[step](out)
    return out


def _layout_1_to_2(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Layout 2 holds layout 1's arrays under the same names: nothing moves."""
    return arrays


def _layout_2_to_3(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Layout 3 holds layout 2's arrays under the same names; the learner adds its new ones (`adopt_state`).

    Which arrays are new follows from the model's features, not from the arrays.
    """
    return arrays


def _layout_3_to_4(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Layout 3's id maps, sorted by key without holes, are already a valid slot order: nothing moves.

    The next snapshot writes them by slot from there on (the same order until ids are forgotten).
    """
    return arrays


# Layout n's arrays into layout n + 1's, by n.
_MIGRATIONS = {1: _layout_1_to_2, 2: _layout_2_to_3, 3: _layout_3_to_4}


def table_params(table: str, named: Mapping[str, paddle.Tensor]) -> list[str]:
    """The structured names of a table's parameters: its embedding and its wide bias."""
    return [n for n in (EMBEDDING.format(table), WIDE.format(table)) if n in named]


def table_of(key: str, cfg: ModelConfig) -> str | None:
    """The table whose rows a state array's first axis follows, if any."""
    match = _TABLE_ARRAY.search(key)
    if match:
        return match.group(2)
    # Statistics follow the behaviour tables' rows; the users' (``stats/user/``) are buckets of
    # their own, whatever a context table is called.
    stats = key.removeprefix(STATS_PREFIX).split("/")
    if key.startswith(STATS_PREFIX) and any(
        t.name == stats[0] and t.feature in BEHAVIOUR_FEATURES for t in cfg.tables
    ):
        return stats[0]
    item = cfg.table("item")
    return item.name if key == KNOWN_ITEMS_KEY and item is not None else None


def widen(array: np.ndarray, old: list[tuple[str, int]], new: list[tuple[str, int]]) -> np.ndarray:
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


def make_ewc(cfg: ModelConfig, module: paddle.nn.Layer) -> OnlineEWC | None:
    """Online EWC over every trainable parameter, or None when ``cfg.ewc_lambda`` is 0."""
    if cfg.ewc_lambda == 0:
        return None
    params = {n: p for n, p in module.named_parameters() if not p.stop_gradient}
    sparse = frozenset(n for n in params if n.startswith(("model.embedding.", "model.wide.")))
    return OnlineEWC(params, sparse, cfg.ewc_lambda, cfg.ewc_gamma, cfg.ewc_normalise)


def unique_rows(ids: np.ndarray) -> paddle.Tensor:
    """The distinct row ids in ``ids``, padding left out, as an int64 tensor."""
    rows = np.unique(ids)
    return paddle.to_tensor(rows[rows != PADDING_BUCKET].astype(np.int64))


def distinct_rows(rows: np.ndarray, n: int) -> np.ndarray:
    """The distinct ``rows`` of a table of ``n`` rows, sorted: ``np.unique``'s, by a bitmap.

    A micro-batch's item rows along its sequences number ~10^5 and hold a few thousand distinct
    ones: marking them costs ~0.2 ms, sorting them (``np.unique``) ~5 ms.
    """
    seen = np.zeros(n, dtype=bool)
    seen[rows] = True
    return np.flatnonzero(seen)


#: The largest gradient Adam can square in float32 (sqrt of float32's largest, 1.8e19). A larger
#: finite one (a number feature sent raw as 1e30) made its second moment inf: the state was lost.
MAX_STEPPABLE = 1.8e19


def all_finite(tensors: Sequence[paddle.Tensor]) -> bool:
    """Whether every element of every tensor is finite and at most `MAX_STEPPABLE`, in one sync.

    A sparse embedding gradient (rows) is checked by its values. The sync per step is the
    price of skipping a poisoned step before it is applied. (AMP's private multi-tensor
    ``check_finite_and_unscale_`` does it in one operator: under 0.5% of a step, measured, not
    worth a private API.)
    """
    flags = [(paddle.abs(_dense(t)) <= MAX_STEPPABLE).all() for t in tensors]  # False for NaN too
    return bool(paddle.stack(flags).all())


def _dense(tensor: paddle.Tensor) -> paddle.Tensor:
    """The values of a tensor: itself, or a sparse gradient's rows of values."""
    if tensor.is_selected_rows():
        # Private API: Paddle has no public accessor for a SelectedRows gradient's values.
        return tensor._get_tensor_from_selected_rows()
    return tensor


def create_optimizer_slots(
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


def numpy_dtype(tensor: paddle.Tensor) -> np.dtype:
    """The numpy dtype of a tensor, without copying it (``set_value`` refuses a mismatch)."""
    return paddle.zeros([0], dtype=tensor.dtype).numpy().dtype


def check_exact(
    arrays: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray], what: str, shapes: bool = True
) -> None:
    """Raise SnapshotError unless ``arrays`` has exactly the keys (and shapes) of ``expected``."""
    if set(arrays) != set(expected):
        missing, extra = sorted(set(expected) - set(arrays)), sorted(set(arrays) - set(expected))
        raise SnapshotError(f"{what} state does not fit this model: missing={missing} extra={extra}")
    for key, array in expected.items() if shapes else ():
        check_shape(key, arrays[key], array.shape)


def check_shape(key: str, array: np.ndarray, shape: tuple[int, ...]) -> None:
    """Raise SnapshotError if ``array`` does not have ``shape``."""
    if tuple(array.shape) != shape:
        raise SnapshotError(f"state array {key} has shape {array.shape}, expected {shape}")
