"""The native consumer runner: confluent-kafka batches, one Kafka transaction per batch.

Per batch: the Redis update (idempotent) first, then one transaction that holds the samples,
the dead letters and the consumed offsets. A crash anywhere before the commit leaves the
offsets where they were; the batch is redone, Redis ignores the events it already holds, and
the aborted samples are never seen by ``read_committed`` readers: exactly-once samples.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from streamrec.config import StreamrecConfig
from streamrec.consumers.processor import BatchResult, SampleBuilder
from streamrec.errors import KafkaDeliveryError
from streamrec.faults import fault_point
from streamrec.featurestore.base import FeatureStore
from streamrec.featurestore.redis_store import RedisFeatureStore
from streamrec.kafka import make_consumer, make_producer, position, produce
from streamrec.source import RecordSource

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
    retries: int = 0


class ConsumerRunner:
    """Consumes ``events_topic`` and produces ``samples_topic`` and ``dlq_topic``."""

    def __init__(self, cfg: StreamrecConfig, store: FeatureStore | None = None) -> None:
        self._cfg = cfg
        self._store = store or RedisFeatureStore(cfg.redis, cfg.consumer.sequence_length)
        self.builder = SampleBuilder(cfg.consumer, self._store)
        self.stats = ConsumerStats()
        self._consumer: Consumer = make_consumer(cfg.kafka, cfg.consumer.group_id)
        self._source = RecordSource(self._consumer, cfg.kafka.max_skew_ms)
        self._producer: Producer = make_producer(
            cfg.kafka,
            **{
                "transactional.id": f"{cfg.consumer.group_id}-{uuid.uuid4().hex}",
                "transaction.timeout.ms": _TXN_BROKER_TIMEOUT_MS,
            },
        )

    def run(self, stop: threading.Event | None = None) -> ConsumerStats:
        """Process batches until ``stop`` is set or ``idle_exit_s`` passes without events."""
        stop = stop or threading.Event()
        ccfg = self._cfg.consumer
        try:
            self._producer.init_transactions(_TXN_TIMEOUT_S)
            self._consumer.subscribe(
                [self._cfg.kafka.events_topic], on_assign=self._on_assign, on_revoke=self._on_revoke
            )
            last_event = time.monotonic()
            while not stop.is_set():
                records = self._source.poll(ccfg.batch_size, ccfg.batch_timeout_s)
                if records or not self._source.joined:  # idleness counts from the group join
                    if records:
                        self._handle(records)
                    last_event = time.monotonic()
                elif ccfg.idle_exit_s is not None and time.monotonic() - last_event > ccfg.idle_exit_s:
                    logger.info("idle for %.1fs, stopping", ccfg.idle_exit_s)
                    break
        finally:
            self._consumer.close()
        logger.info(
            "consumer stopped batches=%d events=%d samples=%d dead=%d retries=%d",
            self.stats.batches, self.stats.events, self.stats.samples, self.stats.dead,
            self.stats.retries,
        )
        return self.stats

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._source.assigned(partitions)
        logger.info("assigned partitions=%s", [f"{p.topic}[{p.partition}]" for p in partitions])

    @property
    def join_seconds(self) -> float:
        """How long the first group join took (0 before it)."""
        joined = self._source.joined_at
        return 0.0 if joined is None else joined - self._source.created_at

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._source.revoked()

    def _handle(self, records: Sequence[Message]) -> None:
        result = self.builder.process(records)
        fault_point("consumer.after_store")
        try:
            self._commit(records, result)
        except KafkaException as exc:
            err = exc.args[0]
            if not err.txn_requires_abort():
                raise KafkaDeliveryError(f"transaction failed: {err.str()}") from exc
            logger.warning("transaction aborted, redoing batch error=%s", err.str())
            self._producer.abort_transaction(_TXN_TIMEOUT_S)
            self._rewind()
            self.stats.retries += 1
            return
        self.stats.batches += 1
        self.stats.events += result.events
        self.stats.samples += len(result.samples)
        self.stats.dead += len(result.dead)
        for letter in result.dead:
            logger.warning(
                "dead letter %s[%d] offset=%d reason=%r",
                letter.source.topic, letter.source.partition, letter.source.offset, letter.reason,
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
            for letter in result.dead:
                produce(
                    self._producer, kcfg.dlq_topic, letter.to_json(),
                    headers={"reason": letter.reason},
                )
            self._producer.send_offsets_to_transaction(
                _next_offsets(records), self._consumer.consumer_group_metadata(), _TXN_TIMEOUT_S
            )
            fault_point("consumer.before_commit")
            self._producer.commit_transaction(_TXN_TIMEOUT_S)
        except KafkaException:
            raise  # the caller decides: abort and redo, or fail
        except BaseException:
            self._producer.abort_transaction(_TXN_TIMEOUT_S)  # leave no open transaction behind
            raise

    def _rewind(self) -> None:
        """Go back to the committed offsets of every partition, dropping what is buffered."""
        self._source.reset()
        for tp in self._consumer.committed(self._consumer.assignment(), timeout=_TXN_TIMEOUT_S):
            offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            self._consumer.seek(TopicPartition(tp.topic, tp.partition, offset))


def _next_offsets(records: Sequence[Message]) -> list[TopicPartition]:
    """The offsets to commit: one past the last record of each partition."""
    last: dict[tuple[str, int], int] = {}
    for msg in records:
        topic, partition, offset = position(msg)
        last[(topic, partition)] = max(last.get((topic, partition), -1), offset)
    return [TopicPartition(t, p, o + 1) for (t, p), o in last.items()]
