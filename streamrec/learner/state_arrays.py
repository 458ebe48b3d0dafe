"""A table learner's whole state as named numpy arrays: taken, restored, and adopted across features.

`StateArrays` is the part of `streamrec.learner.trainer.TableLearner` that a snapshot reads
and writes: parameters, Adam slots, known items, the shuffle, id statistics, feature moments,
online EWC and the id maps, by structured name (keys in `streamrec.learner.state`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import paddle

from streamrec.config import ModelConfig
from streamrec.errors import SnapshotError
from streamrec.features import FeatureSchema
from streamrec.learner.columns import EncodedColumns, SampleColumns
from streamrec.learner.ewc import OnlineEWC
from streamrec.learner.features import FeaturePlan, Moments
from streamrec.learner.idmap import IdMap
from streamrec.learner.idstats import IdStats
from streamrec.learner.state import (
    EMBEDDING,
    EWC_PREFIX,
    FEATURES_PREFIX,
    IDS_PREFIX,
    KNOWN_ITEMS_KEY,
    PARAM_PREFIX,
    SHUFFLE_KEY,
    STATE_LAYOUT,
    STATS_PREFIX,
    check_exact,
    check_shape,
    make_ewc,
    numpy_dtype,
    widen,
)


class StateArrays:
    """The state round trip of a `TableLearner` (which sets every attribute below)."""

    cfg: ModelConfig
    schema: FeatureSchema
    plan: FeaturePlan
    rows: dict[str, int]
    train_module: paddle.nn.Layer
    known_items: np.ndarray
    _slots: dict[str, paddle.Tensor]
    _shuffle_seed: int
    _learn_calls: int
    _stats: IdStats | None
    _moments: Moments
    _ewc: OnlineEWC | None
    _maps: dict[str, IdMap]
    _encoded: tuple[SampleColumns, EncodedColumns] | None

    def _build(self, rows: Mapping[str, int]) -> None:
        """(Re)build everything sized by the tables' rows, freshly initialised (the learner's)."""
        raise NotImplementedError

    def state_arrays(self) -> dict[str, np.ndarray]:
        """Everything needed to resume training: parameters, Adam slots, known items, shuffle.

        Keys are structured names (``model/model.embedding.tables.item.weight``,
        ``optimizer/model.embedding.tables.item.weight/moment1``), stable across processes.
        """
        arrays = {
            PARAM_PREFIX + name: tensor.numpy() for name, tensor in self.train_module.state_dict().items()
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
        check_exact(ids, {k: a[:0] for k, a in self._ids_state().items()}, "id map", shapes=False)
        expected = {*targets, *stats, KNOWN_ITEMS_KEY, SHUFFLE_KEY}
        if set(arrays) != expected:
            missing, extra = sorted(expected - set(arrays)), sorted(set(arrays) - expected)
            raise SnapshotError(f"state arrays do not fit this model: missing={missing} extra={extra}")
        for key, tensor in targets.items():
            check_shape(key, arrays[key], tuple(tensor.shape))
        check_shape(KNOWN_ITEMS_KEY, arrays[KNOWN_ITEMS_KEY], self.known_items.shape)
        check_shape(SHUFFLE_KEY, arrays[SHUFFLE_KEY], (2,))
        for key, array in stats.items():
            check_shape(key, arrays[key], array.shape)
        if self._ewc is not None and ewc:
            check_exact(ewc, self._ewc.state_arrays(EWC_PREFIX), "EWC")
        for key, tensor in targets.items():
            tensor.set_value(np.ascontiguousarray(arrays[key], dtype=numpy_dtype(tensor)))
        self.known_items = np.asarray(arrays[KNOWN_ITEMS_KEY], dtype=np.uint8).copy()
        self._shuffle_seed, self._learn_calls = (int(v) for v in arrays[SHUFFLE_KEY])
        if self._stats is not None:
            self._stats.load_state_arrays(arrays, STATS_PREFIX)
        self._moments.load_state_arrays(arrays, FEATURES_PREFIX)
        self._ewc = make_ewc(self.cfg, self.train_module)  # anchored at the new weights
        if self._ewc is not None and ewc:
            self._ewc.load_state_arrays(ewc, EWC_PREFIX)
        for name, idmap in self._maps.items():
            try:
                idmap.load_state_arrays(ids, f"{IDS_PREFIX}{name}/", rows[name])
            except ValueError as exc:
                raise SnapshotError(f"id map of table {name} is inconsistent: {exc}") from exc
        self._encoded = None

    def adopt_state(
        self, arrays: Mapping[str, np.ndarray], recorded: FeatureSchema, layout: int = STATE_LAYOUT
    ) -> dict[str, np.ndarray]:
        """State saved under ``recorded`` (fewer declared features) or an older ``layout``, made to fit.

        Call on a fresh learner, with arrays `migrate_state` named. The added features'
        tables (and moments), and the arrays the model gained since ``layout`` (`_since`),
        start as this learner's; the layers that read every feature (`_layouts`) get zero
        weights for the new inputs, so the model scores as before until it learns them. EWC
        state is left out (it restarts, as `load_state_arrays` allows). State that already
        fits is returned as it is.
        """
        added = [n for n in self.schema.names if n not in recorded]
        since = self._since(layout)
        if not added and not since:
            return dict(arrays)
        fresh = self.state_arrays()
        owned = self._owned(added) + since
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
                out[key] = widen(saved, old[layer], new[layer])
            elif saved is not None:
                out[key] = saved
        out.update({k: v for k, v in arrays.items() if k not in fresh and not k.startswith(EWC_PREFIX)})
        return out

    def _owned(self, added: list[str]) -> tuple[str, ...]:
        """What the keys of the ``added`` features' own state contain: their tables, their moments."""
        return tuple(f"tables.{self.plan.table_of(n)}." for n in added if self.plan.table_of(n)) + tuple(
            f"{FEATURES_PREFIX}{n}/" for n in added
        )

    def _since(self, layout: int) -> tuple[str, ...]:
        """What the keys of the arrays this model gained since state ``layout`` contain (none by default)."""
        return ()

    def _layouts(self, schema: FeatureSchema) -> dict[str, list[tuple[str, int]]]:
        """The input columns, as (segment, width), of the layers reading every feature under ``schema``.

        By layer name (``head.mlp.0``); `adopt_state` widens them for added features. None
        by default: a model reading no declared feature.
        """
        return {}

    def _ids_state(self) -> dict[str, np.ndarray]:
        """The id maps' state arrays."""
        out: dict[str, np.ndarray] = {}
        for name, idmap in self._maps.items():
            out.update(idmap.state_arrays(f"{IDS_PREFIX}{name}/"))
        return out

    def _rows_in(self, arrays: Mapping[str, np.ndarray]) -> dict[str, int]:
        """Each table's rows in a state: its embedding's; checked against the configuration."""
        rows = {}
        for name, (most, _) in self.plan.tables.items():
            key = f"{PARAM_PREFIX}{EMBEDDING.format(name)}"
            if key not in arrays:
                raise SnapshotError(f"state arrays do not fit this model: missing={[key]}")
            n = int(arrays[key].shape[0])
            dynamic = name in self.plan.dynamic
            if not (3 <= n <= most if dynamic else n == most):
                raise SnapshotError(
                    f"table {name} has {n} rows in the state; this model allows "
                    f"{f'3..{most}' if dynamic else most}"
                )
            rows[name] = n
        return rows
