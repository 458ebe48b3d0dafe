"""Exactly-once commits of a batch's records together with its consumed offsets.

One Kafka transaction carries what a batch produced and the offsets it consumed. The broker
going away mid-transaction is survived without breaking exactly-once:

- a call that fails *retriably* (a timeout: the broker is stalled or unreachable) is called
  again, as librdkafka asks: a commit that already reached the broker is resumed, never
  redone, so its records are not written a second time. This rides out a stall shorter than
  ``transaction.timeout.ms`` (``STREAMREC_KAFKA__TRANSACTION_TIMEOUT_MS``, 60 s);
- a failure that *requires an abort* (a longer stall: the broker aborted the transaction,
  or its records timed out) aborts it (retrying the abort the same way) and raises, so the
  caller redoes the batch. Such an abort bumps the producer epoch (KIP-360): Apache Kafka
  2.5+ does it; the embedded Tansu broker does not, so there the consumer gives up at its
  retry deadline instead;
- a *fatal* failure (the producer was fenced) replaces the producer with a new
  transactional id; the broker aborts the old one's open transaction after
  ``transaction.timeout.ms``.

``wait`` decides between tries: it sleeps (keeping the consumer alive) and returns False
once the caller's retry deadline has passed, which ends the attempt with
`OutageError`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaException, Producer, TopicPartition

from streamrec.config import KafkaConfig
from streamrec.errors import OutageError
from streamrec.faults import fault_point
from streamrec.kafka.clients import make_producer

logger = logging.getLogger(__name__)

# Client-side limit on each transactional call; one that times out is called again.
CALL_TIMEOUT_S = 30.0

#: Sleeps between tries; False when the caller's deadline has passed.
Wait = Callable[[str], bool]


def describe(exc: BaseException) -> str:
    """One line for a failure: the Kafka error's own text, or the exception's."""
    if isinstance(exc, KafkaException) and exc.args:
        return str(exc.args[0].str())
    return str(exc)


class TransactionalProducer:
    """A transactional producer whose `commit` is exactly-once through broker outages."""

    def __init__(self, cfg: KafkaConfig, id_prefix: str) -> None:
        """Transactional ids are ``<id_prefix>-<random>``: one per producer, never reused."""
        self._cfg = cfg
        self._id_prefix = id_prefix
        self._producer = self._new()
        self._ready = False  # init_transactions done

    def _new(self) -> Producer:
        self._ready = False
        return make_producer(
            self._cfg,
            **{
                "transactional.id": f"{self._id_prefix}-{uuid.uuid4().hex}",
                "transaction.timeout.ms": self._cfg.transaction_timeout_ms,
            },
        )

    def commit(
        self,
        fill: Callable[[Producer], None],
        offsets: list[TopicPartition],
        group: Any,  # confluent_kafka's ConsumerGroupMetadata, untyped in its stubs
        wait: Wait,
    ) -> None:
        """Produce what ``fill`` sends and commit it with ``offsets``, in one transaction.

        Raises:
            KafkaException: the transaction was aborted (redo the batch).
            OutageError: a call kept failing until ``wait`` gave up.
        """
        if not self._ready:
            self._call(lambda: self._producer.init_transactions(CALL_TIMEOUT_S), wait)
            self._ready = True
        self._producer.begin_transaction()
        try:
            fill(self._producer)
            self._call(
                lambda: self._producer.send_offsets_to_transaction(offsets, group, CALL_TIMEOUT_S), wait
            )
            fault_point("consumer.before_commit")
            self._call(lambda: self._producer.commit_transaction(CALL_TIMEOUT_S), wait)
        except BaseException:
            self._abort(wait)  # leave no open transaction behind, whatever failed
            raise

    def _call(self, op: Callable[[], object], wait: Wait) -> None:
        """Run a transactional call, calling it again while it fails retriably."""
        while True:
            try:
                op()
                return
            except KafkaException as exc:
                err = exc.args[0]
                if err.fatal() or err.txn_requires_abort() or not err.retriable():
                    raise
                logger.warning("transactional call failed, trying again error=%r", describe(exc))
                if not wait(describe(exc)):
                    raise OutageError(f"the broker did not recover: {describe(exc)}") from exc

    def _abort(self, wait: Wait) -> None:
        """Abort the open transaction; a producer too broken to abort is replaced."""
        try:
            self._call(lambda: self._producer.abort_transaction(CALL_TIMEOUT_S), wait)
        except KafkaException as exc:
            if exc.args[0].fatal():
                logger.warning("producer failed for good, replacing it error=%r", describe(exc))
                self._producer = self._new()
            else:
                logger.warning("abort failed error=%r", describe(exc))
