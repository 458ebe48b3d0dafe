"""Recorded events into samples, and samples into micro-batches.

Samples are built by the consumers' own logic; micro-batches are cut by event time or by
count: the cadence of a learner updating every few minutes, simulated.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from streamrec.config import StreamrecConfig
from streamrec.consumers.processor import SampleBuilder
from streamrec.errors import ConfigError
from streamrec.events import Event
from streamrec.features import FeatureSchema
from streamrec.featurestore import MemoryFeatureStore
from streamrec.featurestore.profiles import MemoryProfileStore
from streamrec.kafka.records import Record
from streamrec.replay.intake import Replayed
from streamrec.samples import Sample

# Events per consumer batch: what `streamrec consumers run` takes by default; the samples do
# not depend on it (the store and the pools follow event time), only the speed does.
_CONSUMER_BATCH = 2_000
_UNITS_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


@dataclass(frozen=True)
class MicroBatch:
    """The samples one learner update sees, in the order the consumers emitted them."""

    index: int
    samples: list[Sample]

    @property
    def first_ts(self) -> int:
        """The earliest sample's event time, epoch ms."""
        return min(s.ts for s in self.samples)

    @property
    def last_ts(self) -> int:
        """The latest sample's event time, epoch ms."""
        return max(s.ts for s in self.samples)


def build_samples(
    events: Sequence[Event], cfg: StreamrecConfig, schema: FeatureSchema | None = None
) -> list[Sample]:
    """The samples the consumers would emit for ``events`` (see `replay_events`)."""
    return replay_events(events, cfg, schema).samples


def replay_events(
    events: Sequence[Event], cfg: StreamrecConfig, schema: FeatureSchema | None = None
) -> Replayed:
    """The samples the consumers would emit for ``events``, and what yielded none.

    The samples come in the order the consumers emit them: event-time order, but for the
    ``join`` mode's, which come at the end of the batch of records that decides their labels.
    They are built by `SampleBuilder` on the in-memory store:
    sequences, labels, negatives and all, with the features ``schema`` declares (default:
    ``cfg``'s, STREAMREC_FEATURES). Its dead letters, duplicates, late events and the
    impressions still undecided at the end come with them, as the consumers count them.
    """
    schema = cfg.feature_schema() if schema is None else schema
    store = _store(cfg, schema)
    builder = sample_builder(cfg, schema, store)
    records = [
        Record(e.to_json(schema), offset, key=e.user_id.encode(), timestamp=e.ts)
        for offset, e in enumerate(events)
    ]
    # Recorded events are in the past: no clock check applies (now = the last event time).
    now_ms = max((e.ts for e in events), default=0)
    results = []
    for start in range(0, len(records), _CONSUMER_BATCH):
        result = builder.process(records[start : start + _CONSUMER_BATCH], now_ms=now_ms)
        builder.commit(result)
        results.append(result)
    return Replayed(
        [s for r in results for s in r.samples],
        [d for r in results for d in r.dead],
        duplicates=sum(r.duplicates for r in results),
        late=sum(r.late for r in results),
        late_labels=sum(r.late_labels for r in results),
        undecided=store.undecided(),
        negatives_short=sum(r.negatives_short for r in results),
    )


def _store(cfg: StreamrecConfig, schema: FeatureSchema) -> MemoryFeatureStore:
    return MemoryFeatureStore(cfg.model.sequence_length, cfg.consumer.dedup_horizon_ms, schema)


def sample_builder(
    cfg: StreamrecConfig, schema: FeatureSchema, store: MemoryFeatureStore | None = None
) -> SampleBuilder:
    """The consumers' sample builder for ``schema``'s features on ``store`` (default: a fresh one)."""
    store = _store(cfg, schema) if store is None else store
    # user features in memory, as the sequences
    profiles = MemoryProfileStore(cfg.consumer.profile_points) if schema.role("user") else None
    return SampleBuilder(cfg.consumer, store, schema=schema, profiles=profiles)


def by_count(samples: Sequence[Sample], size: int, min_size: int = 1) -> list[MicroBatch]:
    """Consecutive micro-batches of ``size`` samples, the last one shorter.

    A last one under ``min_size`` (too small to judge a model by) joins the one before it.

    Examples:
        >>> sample = Sample("e1", "u1", 1_700_000_000_000, "i1", "c1", 1, (), ())
        >>> [len(batch.samples) for batch in by_count([sample] * 7, 3)]
        [3, 3, 1]
        >>> [len(batch.samples) for batch in by_count([sample] * 7, 3, min_size=2)]
        [3, 4]
    """
    if size < 1:
        raise ConfigError(f"micro-batch size must be at least 1, not {size}")
    starts = list(range(0, len(samples), size))
    if len(starts) > 1 and len(samples) - starts[-1] < min_size:
        starts.pop()
    ends = [*starts[1:], len(samples)] if starts else []
    return [MicroBatch(n, list(samples[i:j])) for n, (i, j) in enumerate(zip(starts, ends, strict=True))]


def by_interval(samples: Sequence[Sample], interval_ms: int) -> list[MicroBatch]:
    """One micro-batch per ``interval_ms`` of event time.

    One micro-batch per ``interval_ms`` of event time that has samples, aligned to
    multiples of it (as a learner cutting every few minutes would). Samples stay in the order
    they were emitted: one older than the newest so far (a negative of the ``join`` mode,
    emitted when its impression's window closed) goes with those emitted around it, as it
    would reach a learner.
    """
    if interval_ms < 1:
        raise ConfigError(f"interval must be positive, not {interval_ms} ms")
    batches: list[list[Sample]] = []
    window = None
    for sample in samples:
        if window is None or sample.ts // interval_ms > window:
            window = sample.ts // interval_ms
            batches.append([])
        batches[-1].append(sample)
    return [MicroBatch(n, batch) for n, batch in enumerate(batches)]


def parse_duration(text: str) -> int:
    """``10m``, ``90s``, ``2h``, ``1d`` in milliseconds.

    Raises:
        ConfigError: Not a number followed by s, m, h or d.

    Examples:
        >>> parse_duration("10m"), parse_duration("1.5h")
        (600000, 5400000)
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", text)
    if match is None:
        raise ConfigError(f"{text!r} is not a duration such as 90s, 10m, 2h or 1d")
    return int(float(match.group(1)) * _UNITS_MS[match.group(2)])
