"""The records one Kafka consumer delivers: errors sorted out, partitions aligned in event time."""

from __future__ import annotations

import logging
import time

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from streamrec.alignment import EventTimeAligner
from streamrec.errors import KafkaDeliveryError

logger = logging.getLogger(__name__)


class RecordSource:
    """Wraps a subscribed consumer; its rebalance callbacks must call :meth:`assigned` and
    :meth:`revoked`. ``max_skew_ms=None`` turns event-time alignment off."""

    def __init__(self, consumer: Consumer, max_skew_ms: int | None) -> None:
        self.consumer = consumer
        self._aligner = None if max_skew_ms is None else EventTimeAligner(consumer, max_skew_ms)
        self.created_at = time.monotonic()
        self.joined_at: float | None = None  # first assignment: before it, nobody is idle

    @property
    def joined(self) -> bool:
        """Whether the group has assigned partitions yet."""
        return self.joined_at is not None

    def assigned(self, partitions: list[TopicPartition]) -> None:
        """A new assignment: start aligning afresh."""
        if self.joined_at is None:
            self.joined_at = time.monotonic()
        if self._aligner is not None:
            self._aligner.assign(partitions)

    def revoked(self) -> None:
        """Partitions taken away: drop what is held (it is refetched from committed offsets)."""
        if self._aligner is not None:
            self._aligner.assign([])

    def reset(self) -> None:
        """Drop what is held for the current assignment (after seeking back)."""
        self.assigned(self.consumer.assignment())

    def poll(self, size: int, timeout_s: float) -> list[Message]:
        """Up to about ``size`` data records (the aligner may release a longer run)."""
        messages = self.consumer.consume(max(1, size), max(0.0, timeout_s))
        records = []
        for msg in messages:
            err = msg.error()
            if err is None:
                records.append(msg)
            elif err.code() != KafkaError._PARTITION_EOF:
                if err.fatal():
                    raise KafkaDeliveryError(f"consumer failed: {err.str()}")
                logger.warning("consumer error=%s", err.str())
        return records if self._aligner is None else self._aligner.push(messages)

    def pause_all(self) -> list[TopicPartition]:
        """Pause every assigned partition (keep polling to stay in the group)."""
        assignment = self.consumer.assignment()
        self.consumer.pause(assignment)
        return assignment

    def resume_all(self, assignment: list[TopicPartition]) -> None:
        """Undo :meth:`pause_all`, keeping the aligner's own pauses."""
        self.consumer.resume(assignment)
        if self._aligner is not None:
            self._aligner.reapply()
