"""Rebuild the feature store from the events topic, emitting nothing.

After the store lost its data (Redis restarted without persistence), the consumers refuse to
run: their samples would carry truncated histories. This re-reads every retained event the
consumers processed (below their group's committed offsets), in offset order as they first read
it, through their own batch logic, its samples dropped: sequences, the event ids seen (with the
records they came in), the items' first-seen times, the users' declared user features
(`streamrec.consumers.user_features`) and each partition's state, its watermark and (``join``)
its impression windows, as a clean run left them at those offsets. Records the consumers
dead-letter (not events, misplaced: see `streamrec.consumers.placement`, or late under
``late_events = "dead_letter"``) are left out as they leave them out. The events beyond the
offsets are left to the consumers: stored ahead of them, a later event's trim of its user's
sequence would take what an earlier one's history needs. Finally it writes a new marker, and
the consumers can start again.

``force`` rebuilds a store that is intact, where consumers may still run: the partitions'
state is theirs, so it is replayed in memory only, to judge the records as they did, and left
as it is in the store (written, it would undo what they decided since the offsets read here,
and they would decide it again). So is the state of every partition the store still holds, in
any rebuild; only that of the partitions it lost (all of them when Redis lost its data, some
when an AOF was replayed without its scripts' writes or keys were deleted) is written.

Only what the events topic still retains can be rebuilt: keep its retention longer than the
longest history you need (the sequence TTL).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition

from streamrec.config import StreamrecConfig
from streamrec.consumers.native_runner import (
    adopt_events_topic,
    attach_store,
    connect_timeout,
    make_builder,
    refresh_placement,
)
from streamrec.errors import ConfigError, ConsumeError, FeatureStoreLost
from streamrec.featurestore import FeatureStore, make_feature_store
from streamrec.featurestore.partitions import (
    Claim,
    MemoryPartitionStore,
    PartitionBatch,
    PartitionOutcome,
    PartitionStore,
)
from streamrec.kafka.clients import make_consumer
from streamrec.kafka.records import Partition
from streamrec.kafka.topics import topic_partitions

logger = logging.getLogger(__name__)

# Events per store round trip: large batches amortise the pipeline, as in the consumers.
_BATCH = 5_000
# Metadata requests: a broker answers in milliseconds.
_TIMEOUT_S = 10.0


@dataclass
class RebuildStats:
    """What a rebuild read and stored."""

    events: int = 0  # valid events replayed into the store
    invalid: int = 0  # records that are not events (they are in the dead-letter topic)
    seconds: float = 0.0


def rebuild_store(
    cfg: StreamrecConfig, store: FeatureStore | None = None, *, force: bool = False
) -> RebuildStats:
    """Replay what the consumers processed into the store, then mark the store good.

    What they processed: the events topic below their group's committed offsets.

    The state of the partitions the store still holds is left as it is (under ``force``
    consumers may still run on them: it is theirs); that of the partitions it lost (no state
    while the group committed past 0 on them, `streamrec.featurestore.partitions`) is
    rebuilt, begun afresh for one whose events are all gone by retention.

    Raises:
        ConfigError: the store is intact (its marker is there, and the state of every partition
            the group committed on) and ``force`` is not set, or the group has committed no
            offsets (a group named wrong, or one that never ran).
    """
    store = store or make_feature_store(cfg)
    try:  # a Redis never reached fails at the connect timeout, as the consumers do
        marked = attach_store(store, False, cfg.consumer.retry_deadline_s, connect_timeout(cfg))
    except FeatureStoreLost:
        marked = False  # what a rebuild is for
    topic = cfg.kafka.events_topic
    consumer = make_consumer(cfg.kafka, f"{cfg.consumer.group_id}-rebuild-{uuid.uuid4().hex[:8]}")
    stats, start = RebuildStats(), time.monotonic()
    try:
        partitions = topic_partitions(consumer, topic, _TIMEOUT_S)  # a missing topic: said
        processed = _committed(cfg, partitions)
        if not any(processed.values()):
            raise ConfigError(
                f"nothing to rebuild: the consumers' group {cfg.consumer.group_id!r} has processed no "
                f"events of {topic} (STREAMREC_CONSUMER__GROUP_ID or --group-id names the "
                "group whose store this is; a group that never ran starts on an empty store)"
            )
        # the partitions whose state the store lost (all of them when it lost everything)
        lost = store.stateless([Partition(topic, p) for p, offset in processed.items() if offset > 0])
        if marked and not force and not lost:
            raise ConfigError(
                "the feature store is intact (its marker is there, and the state of every partition "
                "the consumers committed on): --force rebuilds it anyway"
            )
        if marked and lost:
            logger.warning("rebuilding the state of partitions the store lost partitions=%s",
                           ",".join(str(key) for key in sorted(lost)))
        # what the consumers dead-letter, misplaced records too; the state of the partitions the
        # store still holds is theirs (consumers may run on them under force): replayed aside
        builder = make_builder(cfg, store, Replayed(store, lost))
        adopt_events_topic(cfg, store, builder)
        reading = _assign(consumer, topic, processed)
        refresh_placement(builder, consumer, [topic])
        while reading:  # until every partition has reached the group's offset
            records = [m for m in consumer.consume(_BATCH, 1.0) if _keep(m, reading, processed)]
            if records:  # as the consumers processed them, their samples dropped
                result = builder.process(records, int(time.time() * 1000))
                builder.commit(result)  # the watermarks judge the next records as they did
                stats.events += result.events
                stats.invalid += len(result.dead)
        # a lost partition with no event retained: its state begun, so that the consumers find it
        if unread := store.stateless(lost):
            store.claim({key: processed[key.partition] for key in unread})
    finally:
        consumer.close()
    store.reset_marker()
    stats.seconds = time.monotonic() - start
    logger.info(
        "feature store rebuilt events=%d invalid=%d seconds=%.1f", stats.events, stats.invalid, stats.seconds
    )
    return stats


class Replayed(PartitionStore):
    """The partitions' state a rebuild replays.

    Into ``store`` for the partitions it lost, in memory for the rest (kept as they are there).
    """

    def __init__(self, store: PartitionStore, lost: set[Partition]) -> None:
        """Write only the state of ``lost`` to ``store``."""
        self._store, self._memory, self._lost = store, MemoryPartitionStore(), lost

    def _split(self, keys: Iterable[Partition]) -> list[tuple[PartitionStore, list[Partition]]]:
        keys = list(keys)
        lost = [key for key in keys if key in self._lost]
        kept = [key for key in keys if key not in self._lost]
        return [(store, part) for store, part in ((self._store, lost), (self._memory, kept)) if part]

    def claim(self, starts: Mapping[Partition, int], *, create: bool = True) -> dict[Partition, Claim]:
        """See `PartitionStore.claim`."""
        out: dict[Partition, Claim] = {}
        for store, keys in self._split(starts):
            out.update(store.claim({key: starts[key] for key in keys}, create=create))
        return out

    def stateless(self, partitions: Iterable[Partition]) -> set[Partition]:
        """See `PartitionStore.stateless`."""
        return {key for store, keys in self._split(partitions) for key in store.stateless(keys)}

    def advance(
        self, batches: Sequence[PartitionBatch], window_ms: int, retention_ms: int
    ) -> list[PartitionOutcome]:
        """See `PartitionStore.advance`: the outcomes in the order of ``batches``."""
        by_key = {batch.partition: batch for batch in batches}
        out: dict[Partition, PartitionOutcome] = {}
        for store, keys in self._split(by_key):
            out.update(zip(keys, store.advance([by_key[key] for key in keys], window_ms, retention_ms),
                           strict=True))
        return [out[batch.partition] for batch in batches]

    def check_claims(self, epochs: Mapping[Partition, int]) -> None:
        """See `PartitionStore.check_claims`."""
        for store, keys in self._split(epochs):
            store.check_claims({key: epochs[key] for key in keys})


def _committed(cfg: StreamrecConfig, partitions: list[int]) -> dict[int, int]:
    """The consumers' group's committed offset on each of ``partitions`` (0: none yet)."""
    topic = cfg.kafka.events_topic
    group = make_consumer(cfg.kafka, cfg.consumer.group_id)  # asks, never joins: no subscription
    try:
        asked = [TopicPartition(topic, p) for p in sorted(partitions)]
        committed = group.committed(asked, timeout=_TIMEOUT_S)
    except KafkaException as exc:
        raise ConsumeError(f"reading the consumers' committed offsets failed: {exc}") from exc
    finally:
        group.close()
    return {tp.partition: max(tp.offset, 0) for tp in committed}


def _assign(consumer: Consumer, topic: str, processed: dict[int, int]) -> set[int]:
    """Read each partition of ``topic`` the consumers processed from its beginning; returns them."""
    partitions = {p for p, offset in processed.items() if offset > 0}
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(partitions)])
    return partitions


def _keep(msg: Message, reading: set[int], processed: dict[int, int]) -> bool:
    """Whether ``msg`` is a record to replay.

    A partition leaves ``reading`` at the last record the consumers processed, or at its end.
    """
    err, partition = msg.error(), msg.partition() or 0
    if err is not None and err.code() != KafkaError._PARTITION_EOF:
        raise ConsumeError(f"reading the events topic failed: {err.str()}")
    offset = -1 if err is not None else (msg.offset() or 0)
    if err is not None or offset + 1 >= processed[partition]:
        reading.discard(partition)
    return err is None and offset < processed[partition]
