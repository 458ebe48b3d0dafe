"""The native consumer runner: confluent-kafka batches, one Kafka transaction per batch.

Per batch: the Redis update (idempotent) first, then one transaction that holds the samples,
the dead letters and the consumed offsets, begun once the batch's partitions are found still
this consumer's (`check_claims`). A
crash anywhere before the commit leaves the offsets where they were; the batch is redone,
Redis ignores the events it already holds, and the aborted samples are never seen by
``read_committed`` readers: exactly-once samples.

When Redis or the broker fails for a while, the batch is redone with backoff, its partitions
held and the consumer kept in its group, until ``retry_deadline_s``; only then does the
runner stop, with `OutageError` (see ``streamrec.kafka.transactions``
for how a transaction survives a broker stall). A stop signal ends those retries at once,
the batch uncommitted. A Redis that never answered since the start is no outage but a wrong
URL or a Redis not started: it is waited for ``STREAMREC_STORE__CONNECT_TIMEOUT_S`` only.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from confluent_kafka import KafkaException, Message, Producer, TopicPartition

from streamrec.config import RedisStoreConfig, StreamrecConfig
from streamrec.consumers.placement import Placement
from streamrec.consumers.processor import TIMESTAMP_TOLERANCE_MS, BatchResult, Parsed, SampleBuilder
from streamrec.deadletters import DeadLetterLog
from streamrec.errors import (
    ConsumeError,
    FeatureStoreUnavailable,
    FeatureStoreUnreachable,
    OutageError,
    Stopped,
)
from streamrec.faults import fault_point
from streamrec.featurestore import FeatureStore, make_feature_store, make_profile_store
from streamrec.featurestore.partitions import PartitionStore, refuse_lost
from streamrec.kafka.clients import make_consumer, produce
from streamrec.kafka.records import Partition
from streamrec.kafka.source import IdleClock, RecordSource
from streamrec.kafka.topics import MetadataClient, partition_counts, topic_id
from streamrec.kafka.transactions import TransactionalProducer, describe
from streamrec.retry import Backoff

logger = logging.getLogger(__name__)

# Reading the group's committed offsets at start, and partition counts: a broker answers in
# milliseconds.
_COMMITTED_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class BatchReport:
    """One committed batch, for whoever watches the consumer."""

    result: BatchResult  # events, samples, dead letters (with reasons), duplicates
    seconds: float  # from reading the batch to its commit, retries included
    newest_event_ms: int | None  # the latest event time among its samples
    partitions: list[Partition]  # assigned when it was committed


@dataclass
class ConsumerStats:
    """Running totals of one runner."""

    batches: int = 0
    events: int = 0
    samples: int = 0
    dead: int = 0
    duplicates: int = 0
    late: int = 0  # behind their partition's watermark: dead-lettered or kept without samples
    late_labels: int = 0  # late clicks in a closed impression window (the join mode)
    timestamp_mismatches: int = 0  # records whose timestamp is not their event time
    out_of_order: int = 0  # released out of event-time order by alignment (skewed timestamps)
    retries: int = 0


class ConsumerRunner:
    """Consumes ``events_topic`` and produces ``samples_topic`` and ``dlq_topic``."""

    def __init__(
        self,
        cfg: StreamrecConfig,
        store: FeatureStore | None = None,
        on_batch: Callable[[BatchReport], None] | None = None,
    ) -> None:
        """Build the clients.

        ``store`` defaults to the one ``cfg.store`` names; ``on_batch`` hears of every committed
        batch (metrics, a progress display).
        """
        self._cfg = cfg
        self._on_batch = on_batch
        self._store = store or make_feature_store(cfg)
        self.builder = make_builder(cfg, self._store)
        self.stats = ConsumerStats()
        self._log = make_batch_log(cfg)
        self._source = RecordSource(
            make_consumer(cfg.kafka, cfg.consumer.group_id),
            [cfg.kafka.events_topic],
            cfg.kafka.max_skew_ms,
            max_hold_ms=cfg.kafka.max_hold_ms,
        )
        # a partition the store holds no state of: new to the group, or lost (see SampleBuilder._claim)
        self.builder.committed = functools.partial(self._source.committed_offsets, _COMMITTED_TIMEOUT_S)
        self._transactions = TransactionalProducer(cfg.kafka, cfg.consumer.group_id)
        self._stop = threading.Event()  # run()'s: set by a stop signal

    def run(self, stop: threading.Event | None = None) -> ConsumerStats:
        """Process batches until ``stop`` is set or ``stop_when_idle_s`` passes without events."""
        stop = self._stop = stop or threading.Event()
        ccfg = self._cfg.consumer
        try:
            self._attach_store()
            self._source.subscribe()
            idle = IdleClock(ccfg.stop_when_idle_s, self._source)
            claimed_at = self._source.assignments
            # Each batch is polled one turn ahead, so that it is parsed while the batch before
            # it waits on Redis; the consumer is still only polled between batches.
            ahead: _Polled | None = None
            while not stop.is_set():
                records = self._source.poll(ccfg.batch_size, 0.0 if ahead else ccfg.batch_timeout_s)
                if self._source.assignments != claimed_at:  # a rebalance: claim partitions anew
                    claimed_at = self._source.assignments
                    self.builder.release()
                    refresh_placement(self.builder, self._source.consumer, [self._cfg.kafka.events_topic])
                    ahead = None  # read again from the committed offsets, by their new owner
                polled = _Polled(self.builder, records) if records else None
                if ahead is not None:
                    self._handle(ahead, polled.parse if polled else None)
                    idle.busy()  # a batch redone through an outage must not look like idleness
                elif polled is None and idle.expired():
                    logger.info("idle for %.1fs, stopping", ccfg.stop_when_idle_s)
                    break
                ahead = polled
        except Stopped as exc:
            logger.warning("%s", exc)
        finally:
            self._source.close()
        logger.info(
            "consumer stopped batches=%d events=%d samples=%d dead=%d duplicates=%d late=%d "
            "late_labels=%d timestamp_mismatches=%d out_of_order=%d retries=%d",
            self.stats.batches, self.stats.events, self.stats.samples, self.stats.dead,
            self.stats.duplicates, self.stats.late, self.stats.late_labels, self.stats.timestamp_mismatches,
            self.stats.out_of_order, self.stats.retries,
        )
        return self.stats

    def _attach_store(self) -> None:
        """Check the store and adopt the events topic before the first batch, waiting for Redis."""
        # A store that is empty while the group already processed events lost its data; so did
        # one that holds nothing of a partition the group committed on.
        committed = self._source.committed_offsets(_COMMITTED_TIMEOUT_S)
        attach_store(
            self._store, not has_offsets(committed), self._cfg.consumer.retry_deadline_s,
            connect_timeout(self._cfg), self._stop,
            then=lambda: adopt_events_topic(self._cfg, self._store, self.builder), committed=committed,
        )

    @property
    def assignments(self) -> int:
        """Partition assignments received so far: more than one means a rebalance happened."""
        return self._source.assignments

    def assigned(self) -> list[Partition]:
        """The partitions assigned now (none before the group is joined, or while it rebalances)."""
        return self._source.assigned()

    def _handle(self, batch: _Polled, meanwhile: Callable[[], None] | None) -> None:
        """Process and commit one batch, retrying passing failures.

        Process and commit one batch, redoing it after a passing failure of Redis or the
        broker (with backoff, partitions held) until the retry deadline; ``meanwhile`` runs
        while Redis works on it.
        """
        records = batch.records
        retry = Backoff(self._cfg.consumer.retry_deadline_s)

        def wait(reason: str) -> bool:
            self.stats.retries += 1
            return self._wait(retry, reason)

        assignments = self._source.assignments
        started = time.monotonic()
        while True:
            try:
                result = self.builder.process(records, parsed=batch.parsed(), meanwhile=meanwhile)
                fault_point("consumer.after_store")
                # a process stalled past its session timeout since its writes finds its
                # partitions claimed by their new owner, and stops before it sends anything:
                # the embedded broker would commit its transaction too (Apache Kafka 2.5+
                # refuses a stale group member's offsets, KIP-447)
                self._store.check_claims(result.claims)
                self._transactions.commit(
                    functools.partial(self._fill, result=result),
                    _next_offsets(records),
                    self._source.consumer.consumer_group_metadata(),
                    wait,
                )
                break
            except (FeatureStoreUnavailable, KafkaException) as exc:
                reason = describe(exc)
                logger.warning("batch failed, redoing it error=%r retries=%d", reason, self.stats.retries)
                if not wait(reason):
                    raise OutageError.gave_up(retry.deadline_s, reason) from exc
                if self._source.assignments != assignments:
                    return  # rebalanced while waiting: the batch is read again by its owner
        self.builder.commit(result)  # the batch's in-memory state moves with its offsets
        count_batch(self.stats, result, self._log)
        self.stats.out_of_order = self._source.out_of_order
        if self._on_batch is not None:
            newest = max((s.ts for s in result.samples), default=None)
            self._on_batch(BatchReport(result, time.monotonic() - started, newest, self._source.assigned()))

    def _fill(self, producer: Producer, *, result: BatchResult) -> None:
        """Send a batch's samples and dead letters (inside its transaction)."""
        kcfg = self._cfg.kafka
        topic, send = kcfg.samples_topic, producer.produce
        key, user = b"", None
        for sample, value in zip(result.samples, result.values, strict=True):
            if sample.user_id is not user:  # an event's samples come together: one key
                user = sample.user_id
                key = user.encode()
            try:  # the common case without the helper's call, and positional: partition -1
                # (by key), no callbacks, the timestamp; keywords cost CPython's argument
                # parser ~4,000 instructions a call, 5% of the consumer's work
                send(topic, value, key, -1, None, None, sample.ts)
            except BufferError:
                produce(producer, topic, value, key=key, timestamp_ms=sample.ts)
        limit = self._cfg.consumer.dead_letter_max_bytes
        for letter in result.dead:
            produce(
                producer, kcfg.dlq_topic, letter.record_value(limit), key=letter.key,
                timestamp_ms=letter.timestamp_ms, headers=letter.record_headers(limit),
            )

    def _wait(self, retry: Backoff, reason: str) -> bool:
        """Sleep the next backoff with every partition held, serving the consumer (so it stays in its group).

        False once the deadline has passed.

        Raises:
            Stopped: the stop event was set: the batch is left uncommitted.
        """
        pause = retry.next_pause()
        if pause is None:
            return False
        self._source.hold()
        try:
            end = time.monotonic() + pause
            while (left := end - time.monotonic()) > 0:
                if self._stop.is_set():
                    raise Stopped(
                        f"stopped while waiting for a service ({reason}): the unfinished batch was not "
                        "committed and is redone at the next start"
                    )
                self._source.keepalive(min(left, 1.0))
        finally:
            self._source.release()
        return True


class _Polled:
    """A batch of records, parsed once (`parse`, ahead of its turn or when it comes)."""

    def __init__(self, builder: SampleBuilder, records: list[Message]) -> None:
        self.records = records
        self._builder = builder
        self._parsed: Parsed | None = None

    def parsed(self) -> Parsed:
        """The records parsed."""
        if self._parsed is None:
            self._parsed = self._builder.parse(self.records, int(time.time() * 1000))
        return self._parsed

    def parse(self) -> None:
        """Parse the records now, while there is time."""
        self.parsed()


def make_batch_log(cfg: StreamrecConfig) -> BatchLog:
    """The runners' warnings of committed batches.

    Late events are logged only when kept in their sequences (dead-lettered ones are among the
    dead letters).
    """
    return BatchLog(cfg.kafka.dlq_topic, late=cfg.consumer.late_events == "sequence_only")


def make_builder(
    cfg: StreamrecConfig, store: FeatureStore, partitions: PartitionStore | None = None
) -> SampleBuilder:
    """The runners' builder, its partitions' state kept in ``partitions`` (by default ``store``).

    Record timestamps are checked against the alignment's skew, and records' placement against
    the configured partitioner (the runner keeps its partition counts,
    `refresh_placement`).
    """
    skew = cfg.kafka.max_skew_ms
    tolerance = TIMESTAMP_TOLERANCE_MS if skew is None else skew
    partitioner = cfg.kafka.partitioner
    placement = None if partitioner is None else Placement(partitioner)
    schema = cfg.feature_schema()
    profiles = make_profile_store(cfg) if schema.role("user") else None  # kept when any is declared
    return SampleBuilder(
        cfg.consumer, store, timestamp_tolerance_ms=tolerance, placement=placement, schema=schema,
        profiles=profiles, partitions=partitions,
    )


def refresh_placement(builder: SampleBuilder, client: MetadataClient, topics: Sequence[str]) -> None:
    """Read the topics' partition counts for the placement check.

    Read the topics' partition counts for the builder's placement check, at an assignment
    (partitions added to a topic rebalance its consumers). A failed read keeps the counts read
    before, with a warning, and raises only when there are none yet.

    Raises:
        ConsumeError: the counts could not be read, and none were before.
    """
    placement = builder.placement
    if placement is None:
        return
    try:
        placement.counts = partition_counts(client, topics, _COMMITTED_TIMEOUT_S)
    except ConsumeError as exc:
        if not placement.counts:
            raise
        logger.warning("partition counts not read again, checking by those read before error=%r", str(exc))


class BatchLog:
    """The warnings of committed batches, rate-limited.

    A flood of bad or late events must not bury the rest of the log (the dead-letter topic and
    the counts are the full record). Dead letters as `DeadLetterLog` logs them; late
    events kept in their sequences (``late``) at most once every ``every_s``, with the count
    since the warning before.
    """

    def __init__(
        self, dlq_topic: str, *, late: bool, every_s: float = 60.0, burst: int = 20,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Warn of late events when ``late``.

        At most ``burst`` dead letters every ``every_s`` seconds of ``clock``.
        """
        self._dead = DeadLetterLog(logger, dlq_topic, burst=burst, every_s=every_s, clock=clock)
        self._late, self._every_s, self._clock = late, every_s, clock
        self._late_pending = 0
        self._late_logged_at: float | None = None

    def add(self, result: BatchResult) -> None:
        """Log what a committed batch calls for."""
        self._dead.add(result.dead)
        if not self._late:
            return
        self._late_pending += result.late
        now, last = self._clock(), self._late_logged_at
        if self._late_pending and (last is None or now - last >= self._every_s):
            logger.warning(
                "late events kept in their sequences without samples late=%d (since the last such "
                "warning; at most one every %gs)", self._late_pending, self._every_s,
            )
            self._late_pending, self._late_logged_at = 0, now


def count_batch(stats: ConsumerStats, result: BatchResult, log: BatchLog) -> None:
    """Add a committed batch to the runner's totals, and log it through ``log``."""
    stats.batches += 1
    stats.events += result.events
    stats.samples += len(result.samples)
    stats.dead += len(result.dead)
    stats.duplicates += result.duplicates
    stats.late += result.late
    stats.late_labels += result.late_labels
    stats.timestamp_mismatches += result.timestamp_mismatches
    log.add(result)


def _next_offsets(records: Sequence[Message]) -> list[TopicPartition]:
    """The offsets to commit: one past the last record of each partition."""
    last: dict[tuple[str | None, int | None], int] = {}
    for msg in records:
        key, offset = (msg.topic(), msg.partition()), msg.offset()
        if offset is None:
            raise ValueError("a record without an offset has no position")
        if offset > last.get(key, -1):
            last[key] = offset
    out = []
    for (topic, partition), offset in last.items():
        if topic is None or partition is None:
            raise ValueError("a record without a topic or partition has no position")
        out.append(TopicPartition(topic, partition, offset + 1))
    return out


def adopt_events_topic(cfg: StreamrecConfig, store: FeatureStore, builder: SampleBuilder) -> None:
    """Tell the store which events topic is read, and the builder how its records' origins end.

    See `FeatureStore.events_topic`: a topic created again since the store last read it gets
    origins of its own, so its records never pass for the old topic's.
    """
    builder.origin_ending = store.events_topic(topic_id(cfg.kafka, cfg.kafka.events_topic))


def attach_store(
    store: FeatureStore,
    can_start_empty: bool,
    deadline_s: float,
    connect_timeout_s: float,
    stop: threading.Event | None = None,
    then: Callable[[], object] | None = None,
    *,
    committed: Mapping[Partition, int] | None = None,
) -> bool:
    """Check the store before the first batch, waiting for it to come up.

    Check the store before the first batch (see `FeatureStore.attach`), waiting with
    backoff for a Redis that is not up yet: up to ``connect_timeout_s`` while it has never
    answered (a wrong URL, Redis not started), up to ``deadline_s`` once it has (restarting,
    loading its data). False when ``stop`` was set meanwhile (nothing attached).

    ``committed``, the consumers' group's committed offset on each partition (negative: none):
    the store must hold the state of each partition committed past 0 (`refuse_lost`).

    ``then`` (the events topic's adoption) runs after the attach under the same wait: an
    outage that begins between the two is ridden out as one during the attach (which is
    tried again: it only reads, or sets the marker if it is not there).

    Raises:
        FeatureStoreUnreachable: the store never answered within ``connect_timeout_s``.
        OutageError: the store stayed unavailable past the deadline.
        FeatureStoreLost: the store lost its data, or the state of a partition.
    """
    stop = stop or threading.Event()
    # the connect timeout counts from the first try: a try at a host that drops packets
    # takes a whole connection timeout of its own
    unreached, retry = Backoff(connect_timeout_s), Backoff(deadline_s)
    unreached.start()
    unreached_logged = False
    while not stop.is_set():
        try:
            store.attach(can_start_empty)
            refuse_lost(store, committed or {})
            if then is not None:
                then()
            return True
        except FeatureStoreUnreachable as exc:
            if (pause := unreached.next_pause()) is None:
                why = str(exc).rstrip(".")
                raise FeatureStoreUnreachable(
                    f"{why}; waited {connect_timeout_s:g} s (STREAMREC_STORE__CONNECT_TIMEOUT_S): fix the "
                    "URL, or start Redis (`streamrec up`)"
                ) from exc
            # once: the error line at the end says the rest
            log = logger.debug if unreached_logged else logger.warning
            log("feature store unavailable at start, waiting up to %gs for it to answer error=%r",
                connect_timeout_s, str(exc))
            unreached_logged = True
        except FeatureStoreUnavailable as exc:
            if (pause := retry.next_pause()) is None:
                raise OutageError.gave_up(retry.deadline_s, exc) from exc
            logger.warning("feature store unavailable at start, waiting error=%r", str(exc))
        stop.wait(pause)
    return False


def has_offsets(committed: Mapping[Partition, int]) -> bool:
    """Whether a group committed offsets (`RecordSource.committed_offsets`): it processed records before."""
    return any(offset >= 0 for offset in committed.values())


def connect_timeout(cfg: StreamrecConfig) -> float:
    """How long a store that never answered is waited for at start.

    How long a store that never answered is waited for at start (a Redis store's
    ``connect_timeout_s``; the retry deadline for any other).
    """
    store = cfg.store
    return store.connect_timeout_s if isinstance(store, RedisStoreConfig) else cfg.consumer.retry_deadline_s
