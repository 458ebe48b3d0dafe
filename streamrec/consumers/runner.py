"""The native consumer runner: confluent-kafka batches, one Kafka transaction per batch.

Per batch: the Redis update (idempotent) first, then one transaction that holds the samples,
the dead letters and the consumed offsets. A crash anywhere before the commit leaves the
offsets where they were; the batch is redone, Redis ignores the events it already holds, and
the aborted samples are never seen by ``read_committed`` readers: exactly-once samples.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from confluent_kafka import KafkaException, Message, Producer, TopicPartition

from streamrec.config import StreamrecConfig
from streamrec.consumers.processor import BatchResult, SampleBuilder
from streamrec.errors import TransactionError
from streamrec.faults import fault_point
from streamrec.featurestore import FeatureStore, make_feature_store
from streamrec.kafka.clients import make_consumer, make_producer, produce
from streamrec.kafka.records import Partition, Position
from streamrec.kafka.source import RecordSource

logger = logging.getLogger(__name__)

# Client-side limit on each transactional call.
_TXN_TIMEOUT_S = 30.0
# A transaction left open by a killed process blocks read_committed readers until the broker
# aborts it: 20 s bounds that stall, while one batch's transaction takes well under a second.
_TXN_BROKER_TIMEOUT_MS = 20_000


@dataclass
class ConsumerStats:
    """Running totals of one runner."""

    batches: int = 0
    events: int = 0
    samples: int = 0
    dead: int = 0
    duplicates: int = 0
    out_of_order: int = 0  # released out of event-time order by alignment (skewed timestamps)
    retries: int = 0


class ConsumerRunner:
    """Consumes ``events_topic`` and produces ``samples_topic`` and ``dlq_topic``."""

    def __init__(self, cfg: StreamrecConfig, store: FeatureStore | None = None) -> None:
        """Build the clients; ``store`` defaults to the one ``cfg.store`` names."""
        self._cfg = cfg
        self._store = store or make_feature_store(
            cfg.store, cfg.model.sequence_length, cfg.consumer.dedup_horizon_ms
        )
        self.builder = SampleBuilder(cfg.consumer, self._store)
        self.stats = ConsumerStats()
        self._source = RecordSource(
            make_consumer(cfg.kafka, cfg.consumer.group_id),
            [cfg.kafka.events_topic],
            cfg.kafka.max_skew_ms,
            max_hold_ms=cfg.kafka.max_hold_ms,
        )
        self._producer: Producer = make_producer(
            cfg.kafka,
            **{
                "transactional.id": f"{cfg.consumer.group_id}-{uuid.uuid4().hex}",
                "transaction.timeout.ms": _TXN_BROKER_TIMEOUT_MS,
            },
        )

    def run(self, stop: threading.Event | None = None) -> ConsumerStats:
        """Process batches until ``stop`` is set or ``stop_when_idle_s`` passes without events."""
        stop = stop or threading.Event()
        ccfg = self._cfg.consumer
        try:
            self._producer.init_transactions(_TXN_TIMEOUT_S)
            self._source.subscribe()
            while not stop.is_set():
                records = self._source.poll(ccfg.batch_size, ccfg.batch_timeout_s)
                if records:
                    self._handle(records)
                elif ccfg.stop_when_idle_s is not None and self._source.idle_for() > ccfg.stop_when_idle_s:
                    logger.info("idle for %.1fs, stopping", ccfg.stop_when_idle_s)
                    break
        finally:
            self._source.close()
        logger.info(
            "consumer stopped batches=%d events=%d samples=%d dead=%d duplicates=%d "
            "out_of_order=%d retries=%d",
            self.stats.batches, self.stats.events, self.stats.samples, self.stats.dead,
            self.stats.duplicates, self.stats.out_of_order, self.stats.retries,
        )
        return self.stats

    @property
    def assignments(self) -> int:
        """Partition assignments received so far: more than one means a rebalance happened."""
        return self._source.assignments

    @property
    def join_seconds(self) -> float:
        """How long the first group join took (0 before it)."""
        joined = self._source.joined_at
        return 0.0 if joined is None else joined - self._source.created_at

    def _handle(self, records: Sequence[Message]) -> None:
        result = self.builder.process(records)
        fault_point("consumer.after_store")
        try:
            self._commit(records, result)
        except KafkaException as exc:
            err = exc.args[0]
            if not err.txn_requires_abort():
                raise TransactionError(f"transaction failed: {err.str()}") from exc
            logger.warning("transaction aborted, redoing batch error=%s", err.str())
            self._producer.abort_transaction(_TXN_TIMEOUT_S)
            self._source.rewind(_TXN_TIMEOUT_S)
            self.stats.retries += 1
            return
        self.builder.commit(result)  # the batch's in-memory state moves with its offsets
        self.stats.batches += 1
        self.stats.events += result.events
        self.stats.samples += len(result.samples)
        self.stats.dead += len(result.dead)
        self.stats.duplicates += result.duplicates
        self.stats.out_of_order = self._source.out_of_order
        for letter in result.dead:
            logger.warning(
                "dead letter %s offset=%d reason=%r",
                letter.position.key, letter.position.offset, letter.reason,
            )

    def _commit(self, records: Sequence[Message], result: BatchResult) -> None:
        kcfg = self._cfg.kafka
        self._producer.begin_transaction()
        try:
            for sample in result.samples:
                produce(
                    self._producer, kcfg.samples_topic, sample.to_json(),
                    key=sample.user_id.encode(), timestamp_ms=sample.ts,
                )
            limit = self._cfg.consumer.dead_letter_max_bytes
            for letter in result.dead:
                produce(
                    self._producer, kcfg.dlq_topic, letter.record_value(limit), key=letter.key,
                    timestamp_ms=letter.timestamp_ms, headers=letter.record_headers(limit),
                )
            self._producer.send_offsets_to_transaction(
                _next_offsets(records), self._source.consumer.consumer_group_metadata(), _TXN_TIMEOUT_S
            )
            fault_point("consumer.before_commit")
            self._producer.commit_transaction(_TXN_TIMEOUT_S)
        except KafkaException:
            raise  # the caller decides: abort and redo, or fail
        except BaseException:
            self._producer.abort_transaction(_TXN_TIMEOUT_S)  # leave no open transaction behind
            raise


def _next_offsets(records: Sequence[Message]) -> list[TopicPartition]:
    """The offsets to commit: one past the last record of each partition."""
    last: dict[Partition, int] = {}
    for msg in records:
        pos = Position.of(msg)
        last[pos.key] = max(last.get(pos.key, -1), pos.offset)
    return [TopicPartition(*key, offset + 1) for key, offset in last.items()]
