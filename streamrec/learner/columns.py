"""Samples as columns, of any size: a micro-batch, a part of one, a mini-batch.

`SampleColumns` (what every learner takes) and the row ids one model's embedding tables look
up (`EncodedColumns`). The three sizes of batch have one name each: the consumers' *batch*
(the records one consume call reads, committed in one transaction: `BatchResult`), the
learner's *micro-batch* (the samples one update sees: `MicroBatchReport`, `MicroBatchMetrics`)
and the *mini-batch* of one optimizer step (``train_batch_size`` samples); these columns hold
any of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from streamrec.config import BEHAVIOUR_FEATURES, USER_FEATURE, Feature, ModelConfig, TableConfig
from streamrec.features import BUILTIN
from streamrec.learner.hashing import (
    PADDING_BUCKET,
    FirstPositions,
    distinct_fingerprints,
    fingerprint,
    first_positions,
    to_buckets,
)
from streamrec.samples import BUILTIN_FIELDS, Sample, builtin_columns


@dataclass(frozen=True, eq=False)
class SampleColumns:
    """Samples as columns, in sample order. B: batch, N: behaviours of all samples together.

    Every feature is a `FeatureColumn` of ``features``, keyed by its name (as torchrec's
    ``KeyedJaggedTensor``): the default schema's ``item`` and ``category`` first (from the
    sample's ``item_id``/``seq_items`` and ``category_id``/``seq_categories``), then the
    declared ones. The user is the sample's own, ``user_ids``.

    Attributes:
        sample_ids: [B] sample ids.
        user_ids: str[B] the users, for per-user metrics such as GAUC.
        ts: int64[B] event times, epoch ms.
        label: float32[B] 1.0 for a positive, 0.0 for a negative.
        seq_lengths: int64[B] behaviours per sample.
        features: every feature's columns, by name: ``item`` and ``category``'s [B] target
            ids and [N] ids along the sequences, sample after sample, each oldest first.

    Examples:
        A click on ``i1`` after ``i2``, and a sampled negative for it:

        >>> from streamrec.samples import Sample
        >>> batch = SampleColumns.from_samples([
        ...     Sample("e1", "u1", 1_700_000_000_000, "i1", "c1", 1, ("i2",), ("c1",)),
        ...     Sample("e1~n0", "u1", 1_700_000_000_000, "i3", "c2", 0, ("i2",), ("c1",)),
        ... ])
        >>> len(batch), batch.target_ids("item"), batch.label
        (2, ['i1', 'i3'], array([1., 0.], dtype=float32))
        >>> batch.seq_lengths, batch.sequence_ids("item")
        (array([1, 1]), ['i2', 'i2'])
        >>> list(batch.features), batch.features["category"].target
        (['item', 'category'], ['c1', 'c2'])

        Declared features (`Sample.features`, `Sample.seq_features`) follow, one
        `FeatureColumn` per feature name, by the kind of their values:

        >>> batch = SampleColumns.from_samples([
        ...     Sample("e1", "u1", 1, "i1", "c1", 1, ("i2",), ("c1",),
        ...            features={"device": "ios", "genres": ("a", "b")}, seq_features={"genres": (("c",),)}),
        ...     Sample("e2", "u2", 2, "i3", "c2", 0, (), (), features={"genres": ()}),
        ... ])
        >>> batch.features["device"].target
        ['ios', '']
        >>> genres = batch.features["genres"]
        >>> genres.target.values, genres.target.offsets, genres.sequence.values
        (['a', 'b'], array([0, 2, 2]), ['c'])
    """

    sample_ids: list[str]
    user_ids: np.ndarray
    ts: np.ndarray
    label: np.ndarray
    seq_lengths: np.ndarray
    features: Mapping[str, FeatureColumn]
    # `sequence_positions`'s, by feature: the learner's encoding and the report's match
    # features both read them, once per batch.
    _positions: dict[str, FirstPositions] = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def from_samples(cls, samples: Sequence[Sample]) -> SampleColumns:
        """Columns of ``samples``.

        Decoding (`Sample.from_json`) already refuses both; these checks guard samples
        built in code, since one NaN label (from ``None``) poisons every weight.

        Raises:
            ValueError: If a sample's item and category sequences differ in length, a label
                is not 0 or 1, or a declared feature is named as a built-in one.
            TypeError: ``samples`` is not a sequence, or holds what is not a `Sample`.
        """
        if not isinstance(samples, Sequence) or isinstance(samples, str):
            raise TypeError(f"samples is a sequence (a list), not {type(samples).__name__}")
        odd = next((k for k, s in enumerate(samples) if not isinstance(s, Sample)), None)
        if odd is not None:
            raise TypeError(f"samples holds Sample values, not {type(samples[odd]).__name__} (at {odd})")
        n = len(samples)
        lengths, builtin = _builtin_columns(samples)
        label = _labels(samples)
        declared = feature_columns(samples) if any(s.features or s.seq_features for s in samples) else {}
        clash = builtin.keys() & declared.keys()
        if clash:
            name = sorted(clash)[0]
            raise ValueError(f"feature {name!r} is the sample's own field, not a declared feature")
        return cls(
            sample_ids=[s.sample_id for s in samples],
            user_ids=np.array([s.user_id for s in samples], dtype=np.str_),
            ts=np.fromiter((s.ts for s in samples), dtype=np.int64, count=n),
            label=label,
            seq_lengths=lengths,
            features={**builtin, **declared},
        )

    def __len__(self) -> int:
        """The number of samples, B."""
        return len(self.sample_ids)

    def target_ids(self, feature: Feature) -> list[str]:
        """[B] the ids of ``feature`` for each sample (its target's, or, for ``user``, its user's).

        Raises:
            KeyError: the batch has no such feature.
            ValueError: the feature is not of kind ``id`` or has no target side.
        """
        if feature == USER_FEATURE:
            return self.user_ids.tolist()
        return _ids(feature, self.features[feature].target)

    def sequence_ids(self, feature: Feature) -> list[str]:
        """[N] the ids of a behaviour feature along every sample's sequence.

        Raises:
            KeyError: the batch has no such feature.
            ValueError: the feature is not of kind ``id`` or has no sequence side.
        """
        return _ids(feature, self.features[feature].sequence)

    def sequence_positions(self, feature: Feature) -> FirstPositions:
        """`streamrec.learner.hashing.first_positions` of `sequence_ids`, found once per batch.

        Raises:
            KeyError: the batch has no such feature.
            ValueError: the feature is not of kind ``id`` or has no sequence side.
        """
        if feature not in self._positions:
            self._positions[feature] = first_positions(self.sequence_ids(feature))
        return self._positions[feature]


def require_columns(batch: SampleColumns) -> SampleColumns:
    """``batch``, checked to be what a learner takes.

    Raises:
        TypeError: it is not a `SampleColumns` (a list of samples, say).
    """
    if not isinstance(batch, SampleColumns):
        raise TypeError(
            f"a learner takes SampleColumns (SampleColumns.from_samples(samples)), not {type(batch).__name__}"
        )
    return batch


def _builtin_columns(samples: Sequence[Sample]) -> tuple[np.ndarray, dict[str, FeatureColumn]]:
    """int64[B] behaviours per sample, and the default schema's features as columns.

    Raises:
        ValueError: a sample's built-in sequences differ in length.
    """
    n = len(samples)
    read = builtin_columns(samples)
    columns: dict[str, FeatureColumn] = {}
    lengths = np.zeros(n, np.int64)
    first = ""
    for spec in BUILTIN:
        targets, sequences = read[spec.name]
        # Columns in C (map, chain, fromiter), not a Python-level loop per sample: 10^3-10^4
        # samples and 10^5 behaviours a micro-batch.
        counts = np.fromiter(map(len, sequences), dtype=np.int64, count=n)
        if not columns:
            lengths, first = counts, BUILTIN_FIELDS[spec.name][1]
        elif len(bad := np.flatnonzero(lengths != counts)):
            s, along = samples[int(bad[0])], BUILTIN_FIELDS[spec.name][1]
            raise ValueError(
                f"sample {s.sample_id}: {len(getattr(s, first))} {first} but "
                f"{len(getattr(s, along))} {along} in its sequence"
            )
        columns[spec.name] = FeatureColumn(spec.kind, targets, list(chain.from_iterable(sequences)))
    return lengths, columns


def _ids(name: str, column: Column | None) -> list[str]:
    if isinstance(column, list):
        return column
    side = "no such side" if column is None else "no ids of kind 'id'"
    raise ValueError(f"feature {name!r} has {side} in this batch")


@dataclass(frozen=True, eq=False)
class Jagged:
    """Lists of ids, as torchrec's ``KeyedJaggedTensor`` holds one key: values and offsets.

    Attributes:
        values: [V] every list's ids, list after list.
        offsets: int64[L+1]: list ``i`` is ``values[offsets[i]:offsets[i+1]]``.
    """

    values: list[str]
    offsets: np.ndarray

    @classmethod
    def of(cls, lists: Sequence[tuple[str, ...]]) -> Jagged:
        """The lists ``lists`` (an empty one: absent)."""
        offsets = np.zeros(len(lists) + 1, dtype=np.int64)
        np.cumsum([len(x) for x in lists], out=offsets[1:])
        return cls([v for x in lists for v in x], offsets)


#: One side of a declared feature in a batch: ``id`` -> str[L] ("" absent), ``ids`` ->
#: `Jagged`, ``number`` -> float32[L] (NaN absent).
Column = list[str] | Jagged | np.ndarray


@dataclass(frozen=True, eq=False)
class FeatureColumn:
    """One declared feature of a batch. B: batch, N: behaviours of all samples together.

    Attributes:
        kind: ``id``, ``ids`` or ``number`` (as the values read).
        target: [B] the sample's value (the target's, the user's or the context's); None for
            an outcome feature, which only the sequence holds.
        sequence: [N] along the sequences, aligned with every behaviour feature's (the
            item's, say); None for a user or context feature.
    """

    kind: str
    target: Column | None
    sequence: Column | None


def feature_columns(samples: Sequence[Sample]) -> dict[str, FeatureColumn]:
    """The declared features of ``samples`` as columns, by name, each of the kind its values read.

    Raises:
        ValueError: a feature's values are of two kinds.
    """
    names = dict.fromkeys(n for s in samples for n in (*s.features, *s.seq_features))
    columns = {}
    for name in names:
        targets = [s.features.get(name) for s in samples]
        in_sequence = any(name in s.seq_features for s in samples)
        along: list[object] = []
        if in_sequence:
            for s in samples:
                values = s.seq_features.get(name)
                if values is not None and len(values) != len(s.seq_items):
                    raise ValueError(
                        f"sample {s.sample_id}: feature {name!r} has {len(values)} values along "
                        f"{len(s.seq_items)} behaviours"
                    )
                along.extend(values if values is not None else (None,) * len(s.seq_items))
        kind = _kind(name, [*targets, *along])
        has_target = any(v is not None for v in targets) or not in_sequence
        columns[name] = FeatureColumn(
            kind,
            _column(kind, targets) if has_target else None,
            _column(kind, along) if in_sequence else None,
        )
    return columns


def _kind(name: str, values: Sequence[object]) -> str:
    # The distinct types in C (map), not a Python-level test per value: 10^5 values a batch.
    kinds = {_KINDS.get(t, "number") for t in set(map(type, values)) if t is not type(None)}
    if len(kinds) > 1:
        raise ValueError(f"feature {name!r} holds values of kinds {sorted(kinds)} in one batch")
    return kinds.pop() if kinds else "number"


_KINDS: dict[type, str] = {tuple: "ids", str: "id"}


def _column(kind: str, values: Sequence[object]) -> Column:
    if kind == "id":
        return [v if isinstance(v, str) else "" for v in values]
    if kind == "ids":
        return Jagged.of([v if isinstance(v, tuple) else () for v in values])
    return np.array([np.nan if v is None else v for v in values], dtype=np.float32)


def _labels(samples: Sequence[Sample]) -> np.ndarray:
    """float32 [B] labels, each exactly 0 or 1 (``None`` would read as NaN)."""
    label = np.fromiter((s.label for s in samples), dtype=np.float32, count=len(samples))
    bad = np.flatnonzero((label != 0) & (label != 1))
    if len(bad):
        s = samples[int(bad[0])]
        raise ValueError(f"sample {s.sample_id}: label must be 0 or 1, got {s.label!r}")
    return label


@dataclass(frozen=True, eq=False)
class EncodedColumns:
    """Embedding-table row ids of a batch, per table name. B: batch, T: sequence length.

    Sequences are right-aligned: the most recent behaviour sits at position T-1 and padding
    (row 0) fills the left. A sequence longer than T keeps its T most recent behaviours.

    Attributes:
        targets: int64[B] per behaviour table: the target's row.
        sequences: int64[B, T] per behaviour table: the behaviours' rows, 0 = padding.
        context: int64[B] per context table (e.g. the user's row).
        label: float32[B].
        dense: float32[B, F] numeric features (F may be 0), e.g. the target's id statistics.
        extras: the declared features' inputs, ``<name>/target`` and ``<name>/sequence``
            (`streamrec.learner.features.encode_features`); empty without them.
    """

    targets: dict[str, np.ndarray]
    sequences: dict[str, np.ndarray]
    context: dict[str, np.ndarray]
    label: np.ndarray
    dense: np.ndarray
    extras: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        """The number of samples, B."""
        return int(self.label.shape[0])

    def take(self, indices: np.ndarray | Sequence[int]) -> EncodedColumns:
        """The rows at ``indices`` (in that order), for shuffling and chunking."""
        idx = np.asarray(indices, dtype=np.int64)
        return EncodedColumns(
            targets={k: v[idx] for k, v in self.targets.items()},
            sequences={k: v[idx] for k, v in self.sequences.items()},
            context={k: v[idx] for k, v in self.context.items()},
            label=self.label[idx],
            dense=self.dense[idx],
            extras={k: v[idx] for k, v in self.extras.items()},
        )


@dataclass(frozen=True, eq=False)
class ColumnKeys:
    """The `fingerprint` of every id of a batch, per table.

    A batch's sequences repeat few ids many times (each user's history in each of its
    samples), so they are kept as their distinct ids, sorted, and where each behaviour's is:
    a table looks up a tenth as many ids, already in order.

    Attributes:
        targets: uint64[B] per table: the target's id (a context table's: the user's).
        sequences: uint64[U] per behaviour table: the distinct ids along the sequences, sorted.
        sequence_index: int64[N] per behaviour table: each behaviour's (sample after sample,
            unpadded) position in ``sequences``.
    """

    targets: dict[str, np.ndarray]
    sequences: dict[str, np.ndarray]
    sequence_index: dict[str, np.ndarray]


def column_keys(batch: SampleColumns, cfg: ModelConfig) -> ColumnKeys:
    """Fingerprint each id column of ``batch`` once per table of ``cfg``."""
    targets, sequences, index = {}, {}, {}
    for table in cfg.builtin_tables:
        targets[table.name] = fingerprint(batch.target_ids(table.feature))
        if table.feature in BEHAVIOUR_FEATURES:
            positions = batch.sequence_positions(table.feature)
            sequences[table.name], index[table.name] = distinct_fingerprints(positions)
    return ColumnKeys(targets, sequences, index)


def positions(lengths: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each behaviour's row and column in a right-aligned [B, T] sequence, and which fit.

    Right-aligned so the latest sits at T-1; the older ones of a sequence longer than T fall
    left of column 0 and are dropped.

    Returns:
        rows, cols (of the kept behaviours) and keep (bool [N]: within the latest T).
    """
    starts = np.cumsum(lengths) - lengths
    within = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(starts, lengths)
    cols = within + np.repeat(t - lengths, lengths)
    rows = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    keep = cols >= 0
    return rows[keep], cols[keep], keep


#: Maps a table and fingerprints to the table's rows.
RowsOf = Callable[[TableConfig, np.ndarray], np.ndarray]


def hashed_rows(table: TableConfig, keys: np.ndarray) -> np.ndarray:
    """Fingerprints hashed into the rows a table starts with.

    A hashed table's rows; for a dynamic table, what a model with no id map would read.
    """
    return to_buckets(keys, table.start_rows)


def encode(
    batch: SampleColumns, cfg: ModelConfig, keys: ColumnKeys | None = None, rows_of: RowsOf = hashed_rows
) -> EncodedColumns:
    """Encode a batch for a model's tables.

    Map a batch's ids to the rows of ``cfg.tables`` and pad sequences to
    ``cfg.sequence_length``.

    Args:
        batch: The samples.
        cfg: The tables and the sequence length.
        keys: The batch's fingerprints, if already computed.
        rows_of: How each table maps fingerprints to rows (the learner's id maps).
    """
    keys = column_keys(batch, cfg) if keys is None else keys
    t = cfg.sequence_length
    rows, cols, keep = positions(batch.seq_lengths, t)
    targets, sequences, context = {}, {}, {}
    for table in cfg.builtin_tables:
        ids = rows_of(table, keys.targets[table.name])
        if table.feature not in BEHAVIOUR_FEATURES:
            context[table.name] = ids
            continue
        targets[table.name] = ids
        seq = np.full((len(batch), t), PADDING_BUCKET, dtype=np.int64)
        seq[rows, cols] = rows_of(table, keys.sequences[table.name])[keys.sequence_index[table.name][keep]]
        sequences[table.name] = seq
    return EncodedColumns(targets, sequences, context, batch.label, np.zeros((len(batch), 0), np.float32))
