"""The Faust consumer runner.

The same `SampleBuilder` and feature store, driven by a faust-streaming agent (aiokafka
transport) instead of confluent-kafka transactions.

One agent reads the events topic in batches (``stream.take_events``), runs
``SampleBuilder.process`` (the Redis update), sends the samples and dead letters with an
idempotent producer, waits for the broker to acknowledge them, and only then returns, after
which Faust acks the batch's events and commits their offsets in the background.

**Guarantee: at-least-once, not exactly-once.** Faust cannot put the samples and the consumed
offsets in one Kafka transaction as the native runner does. Precisely:

- *A batch that fails* (a bug, a fatal store error such as ``FeatureStoreLost``,
  ``STREAMREC_FAULT``, an outage past ``retry_deadline_s``: `OutageError`) stops the runner
  with that error, as in the native runner, and the next start redoes it. Faust's
  ``take_events`` acks a batch on the way out even when the agent raised (until 2026-12-07
  its offsets were then committed, and the batch skipped for good); the agent keeps a
  reference to each of its messages, so that ack is not the last, Faust marks none of its
  offsets done and commits none past them. What of it reached Redis stays there, and the
  redo is judged a redo (the same histories); samples it had sent before failing appear
  twice, with the same ids. Passing outages of Redis or the broker are no failure: the batch
  is redone in place with backoff, as in the native runner. (The agent holds the failed
  batch until the app stops, so the stream goes on with nothing fetched behind it.)
- *A crash of the process* (kill -9, a lost host) between the store update and Faust's
  offset commit (every ``broker_commit_interval``, 2.8 s) redoes the uncommitted events on restart. Redis
  judges the same record read again as a redo (ACCEPTED, same histories), so the redo emits
  the same samples, with the same ids, again: those already sent before the crash appear
  twice downstream (readers cannot skip them as aborted: nothing is transactional). Events
  resent by applications (another record, same content) are still duplicates yielding nothing.
  Negatives drawn in a redo come from pools that restart empty, so they may differ.
- *A clean stop* (Ctrl-C, SIGTERM, idle) finishes the batch in hand; should its ack miss
  Faust's last commit, the next start redoes it: duplicates again, nothing lost.
- *A batch redone after a passing outage* re-sends the samples whose delivery had already
  been acknowledged before the failure: duplicates, with the same ids.
- *Ordering.* Faust hands out records as each partition delivers them; there is no
  event-time alignment across partitions (the native runner's ``EventTimeAligner``). Each
  user's history is exact either way (a user is one partition, and histories are read in
  event time), but the negative pools see the stream in arrival order, so negatives can differ
  from the native runner's.

So with this runner, deduplicate samples downstream by ``sample_id`` if exactly-once matters;
the native runner (the default) needs none of that.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import faust
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from streamrec.config import StreamrecConfig
from streamrec.consumers.native_runner import (
    BatchReport,
    ConsumerStats,
    adopt_events_topic,
    attach_store,
    connect_timeout,
    count_batch,
    has_offsets,
    make_batch_log,
    make_builder,
    refresh_placement,
)
from streamrec.consumers.processor import BatchResult
from streamrec.errors import FeatureStoreUnavailable, OutageError
from streamrec.faults import fault_point
from streamrec.featurestore import FeatureStore, make_feature_store
from streamrec.kafka.clients import make_consumer, make_producer, produce
from streamrec.kafka.records import Partition, Record
from streamrec.kafka.source import RecordSource, group_offsets
from streamrec.kafka.transactions import describe
from streamrec.retry import Backoff

logger = logging.getLogger(__name__)

# Reading the group's committed offsets at start: a broker answers in milliseconds.
_COMMITTED_TIMEOUT_S = 10.0
# Waiting for the broker to acknowledge a batch's samples: generous against a slow broker,
# short of a session timeout's worth of stall.
_FLUSH_TIMEOUT_S = 30.0
# How often the supervising loop looks at the stop flag and the idle clock.
_TICK_S = 0.1


@dataclass
class FaustStats(ConsumerStats):
    """The native runner's totals, plus the events of the batch that raised (redone next start)."""

    failed: int = 0  # events of a batch that failed: never acked, so the next start reads them again
    failed_origins: list[str] = field(default_factory=list)  # their ``partition:offset``


def to_record(message: Any) -> Record:
    """A Faust ``Message`` as a `Record`.

    A Faust ``Message`` as the `Record` the builder reads (``partition:offset`` is
    the origin the store remembers, as with the native runner).
    """
    timestamp = message.timestamp
    return Record(
        message.value,
        message.offset,
        topic=message.topic,
        partition=message.partition,
        key=message.key,
        # Faust keeps seconds as a float; the event time is integer milliseconds.
        timestamp=0 if timestamp is None else round(timestamp * 1000),
        headers=list(message.headers) if message.headers else None,
    )


def faust_brokers(bootstrap_servers: str) -> list[str]:
    """Faust's broker URLs (aiokafka transport) for a bootstrap list."""
    return [f"kafka://{s.strip().rpartition('://')[2]}" for s in bootstrap_servers.split(",") if s.strip()]


class BatchSink:
    """Delivers a batch's samples and dead letters, acknowledged.

    Sends a batch's samples and dead letters with an idempotent producer and waits until
    the broker acknowledged every one (same topics, keys, timestamps and headers as the native
    runner). Raises `KafkaException` when a record was not delivered.
    """

    def __init__(self, cfg: StreamrecConfig, producer: Producer | None = None) -> None:
        """Send to ``cfg``'s topics; ``producer`` defaults to an idempotent one."""
        self._cfg = cfg
        self.producer = producer or make_producer(cfg.kafka)  # read topic metadata with it too
        self._errors: list[KafkaError] = []

    def _delivered(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self._errors.append(err)

    def send(self, result: BatchResult) -> None:
        """Send and flush; raise if anything failed."""
        kcfg, producer, report = self._cfg.kafka, self.producer, self._delivered
        key, user = b"", None
        for sample, value in zip(result.samples, result.values, strict=True):
            if sample.user_id is not user:  # an event's samples come together: one key
                user = sample.user_id
                key = user.encode()
            produce(producer, kcfg.samples_topic, value, key=key, timestamp_ms=sample.ts,
                    on_delivery=report)
        limit = self._cfg.consumer.dead_letter_max_bytes
        for letter in result.dead:
            produce(
                producer, kcfg.dlq_topic, letter.record_value(limit), key=letter.key,
                timestamp_ms=letter.timestamp_ms, headers=letter.record_headers(limit), on_delivery=report,
            )
        left = producer.flush(_FLUSH_TIMEOUT_S)
        errors, self._errors = self._errors, []
        if errors:
            raise KafkaException(errors[0])
        if left:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"{left} records not delivered"))

    def close(self) -> None:
        """Deliver what is queued."""
        self.producer.flush(_FLUSH_TIMEOUT_S)


class FaustRunner:
    """Consumes ``events_topic`` with a Faust agent.

    Produces ``samples_topic`` and ``dlq_topic``. Same constructor and ``run`` as
    `ConsumerRunner`.
    """

    def __init__(
        self,
        cfg: StreamrecConfig,
        store: FeatureStore | None = None,
        on_batch: Callable[[BatchReport], None] | None = None,
    ) -> None:
        """``store`` defaults to the one ``cfg.store`` names.

        ``on_batch`` hears of every batch whose samples were delivered.
        """
        self._cfg = cfg
        self._on_batch = on_batch
        self._store = store or make_feature_store(cfg)
        self.builder = make_builder(cfg, self._store)
        self.builder.committed = self.committed_offsets  # a partition the store holds nothing of
        self.stats = FaustStats()
        self._log = make_batch_log(cfg)
        self._sink: BatchSink | None = None
        self._fatal: BaseException | None = None
        # Idleness counts from the last batch or group join; None while (re)joining.
        self._idle_since: float | None = None
        self._assigned: set[Partition] = set()
        self._reassigned = False

    def assigned(self) -> list[Partition]:
        """The partitions assigned now (none before the group is joined)."""
        return sorted(self._assigned)

    def run(self, stop: threading.Event | None = None) -> FaustStats:
        """Run the Faust app until stopped, idle, or failed.

        Run the Faust app until ``stop`` is set, ``stop_when_idle_s`` passes without events,
        or a fatal error (raised here, after the app stopped).
        """
        stop = stop or threading.Event()
        if not self._attach_store(stop):
            return self.stats
        self._sink = BatchSink(self._cfg)
        try:
            asyncio.run(self._main(stop))
        finally:
            self._sink.close()
        logger.info(
            "consumer stopped batches=%d events=%d samples=%d dead=%d duplicates=%d late=%d "
            "timestamp_mismatches=%d failed=%d retries=%d",
            self.stats.batches, self.stats.events, self.stats.samples, self.stats.dead,
            self.stats.duplicates, self.stats.late, self.stats.timestamp_mismatches,
            self.stats.failed, self.stats.retries,
        )
        if self._fatal is not None:
            raise self._fatal
        return self.stats

    def app(self) -> faust.App:
        """A new Faust app whose one agent feeds this runner's builder."""
        cfg = self._cfg
        app = faust.App(
            cfg.consumer.group_id,  # Faust's app id is its consumer group: offsets carry over
            broker=faust_brokers(cfg.kafka.bootstrap_servers),
            store="memory://",  # no tables: the feature store is Redis
            web_enabled=False,
            stream_wait_empty=False,  # a held (failed) batch must not stall the stop
            autodiscover=False,
            consumer_auto_offset_reset="earliest",
            topic_partitions=cfg.kafka.partitions,
            broker_session_timeout=cfg.kafka.session_timeout_ms / 1000,
        )
        events = cfg.kafka.events_topic
        topic = app.topic(events, key_type=bytes, value_type=bytes,
                          key_serializer="raw", value_serializer="raw")
        agent_body = self.agent(cfg.consumer.batch_size, cfg.consumer.batch_timeout_s)
        app.agent(topic, name="streamrec-samples")(agent_body)

        @app.on_partitions_assigned.connect
        async def assigned(sender: Any, /, *args: Any, signal: Any, **_: Any) -> None:  # args: (TPs,)
            # the events topic's only: Faust also assigns its own leader topic's partition
            self._assigned = {Partition(tp.topic, tp.partition) for tp in args[0] if tp.topic == events}
            self._reassigned = True  # the next batch claims its partitions anew
            self._idle_since = time.monotonic()

        @app.on_partitions_revoked.connect
        async def revoked(sender: Any, /, *args: Any, signal: Any, **_: Any) -> None:
            self._idle_since = None  # rejoining the group is not idleness

        return app

    def agent(self, max_batch: int, within_s: float) -> Callable[[Any], Any]:
        """The agent body.

        Batches of up to ``max_batch`` events, or what came within ``within_s``. After a failed
        batch it stops taking events (the runner then stops the app, raising the error): Faust
        acks that batch all the same.
        """

        async def samples(stream: Any) -> None:
            # aclosing: leaving the loop closes Faust's generator at once, which acks the batch
            # it yielded last (Faust's own behaviour, made deterministic here).
            async with contextlib.aclosing(stream.take_events(max_batch, within=within_s)) as batches:
                async for events in batches:
                    records = [to_record(event.message) for event in events]
                    if not await self._finish(records):
                        # take_events acks the batch on the way out all the same; a reference
                        # of ours keeps that ack from being the last, so Faust marks none of
                        # its offsets done and commits none past them: the next start redoes it.
                        for event in events:
                            event.message.incref()
                        # Hold it until the app stops: leaving the loop would let the stream
                        # go on with the events fetched behind it meanwhile.
                        await asyncio.Event().wait()

        return samples

    async def _finish(self, records: list[Record]) -> bool:
        """Handle a batch off the event loop, to the end.

        Handle a batch off the event loop, to the end even if the agent is cancelled (a
        stopping app), so that no batch is acked half done; False if it failed.
        """
        work = asyncio.ensure_future(asyncio.to_thread(self.handle, records))
        try:
            await asyncio.shield(work)
        except asyncio.CancelledError:
            await work  # the app is stopping: finish the batch before Faust acks it
            raise
        except Exception as exc:
            self.stats.failed += len(records)
            self.stats.failed_origins += [f"{r.partition()}:{r.offset()}" for r in records]
            logger.error("batch failed; its events are not acked, so the next start redoes them "
                         "events=%d error=%r", len(records), str(exc))
            self._fatal = exc
            return False
        return True

    async def _main(self, stop: threading.Event) -> None:
        """Start the app, watch the stop flag and the idle clock, stop the app."""
        app = self.app()
        limit = self._cfg.consumer.stop_when_idle_s
        await app.start()
        try:
            while not stop.is_set() and self._fatal is None and not app.should_stop:
                await asyncio.sleep(_TICK_S)
                since = self._idle_since
                if limit is not None and since is not None and time.monotonic() - since > limit:
                    logger.info("idle for %.1fs, stopping", limit)
                    break
        finally:
            await app.stop()

    def _attach_store(self, stop: threading.Event) -> bool:
        """Check the store and adopt the events topic before the first batch, waiting for Redis.

        False when ``stop`` was set meanwhile.
        """
        source = RecordSource(make_consumer(self._cfg.kafka, self._cfg.consumer.group_id),
                              [self._cfg.kafka.events_topic], self._cfg.kafka.max_skew_ms)
        try:
            committed = source.committed_offsets(_COMMITTED_TIMEOUT_S)
        finally:
            source.close()
        deadline_s = self._cfg.consumer.retry_deadline_s
        return attach_store(
            self._store, not has_offsets(committed), deadline_s, connect_timeout(self._cfg), stop,
            then=lambda: adopt_events_topic(self._cfg, self._store, self.builder), committed=committed,
        )

    def committed_offsets(self, partitions: Sequence[Partition]) -> dict[Partition, int]:
        """The group's committed offsets of ``partitions`` (negative: none), asked of the broker.

        Only when the store holds no state of a partition about to be claimed (a new one, or a
        loss: see `SampleBuilder._claim`): a consumer of its own that never joins the group.
        """
        consumer = make_consumer(self._cfg.kafka, self._cfg.consumer.group_id)
        try:
            return group_offsets(consumer, partitions, _COMMITTED_TIMEOUT_S)
        finally:
            consumer.close()

    def handle(self, records: Sequence[Record]) -> BatchResult:
        """Process one batch and deliver its samples, retrying passing failures.

        Process one batch and deliver its samples, redoing it through passing failures of
        Redis or the broker until the retry deadline (runs off the event loop).
        """
        if self._sink is None:
            self._sink = BatchSink(self._cfg)
        retry = Backoff(self._cfg.consumer.retry_deadline_s)
        started = time.monotonic()
        if self._reassigned:
            self._reassigned = False
            self.builder.release()
            refresh_placement(self.builder, self._sink.producer, [self._cfg.kafka.events_topic])
        while True:
            try:
                result = self.builder.process(records)
                fault_point("consumer.after_store")
                self._sink.send(result)
                fault_point("consumer.before_commit")
                break
            except (FeatureStoreUnavailable, KafkaException) as exc:
                reason = describe(exc)
                self.stats.retries += 1
                pause = retry.next_pause()
                if pause is None:
                    raise OutageError.gave_up(retry.deadline_s, reason) from exc
                logger.warning("batch failed, redoing it error=%r retries=%d", reason, self.stats.retries)
                time.sleep(pause)
        self.builder.commit(result)
        self._count(result, time.monotonic() - started)
        return result

    def _count(self, result: BatchResult, seconds: float) -> None:
        self._idle_since = time.monotonic()
        count_batch(self.stats, result, self._log)
        if self._on_batch is not None:
            newest = max((s.ts for s in result.samples), default=None)
            self._on_batch(BatchReport(result, seconds, newest, sorted(self._assigned)))
