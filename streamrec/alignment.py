"""Event-time alignment across the partitions one consumer reads.

A consumer catching up on a backlog gets long runs of one partition before the next, so one
group of users' 2016 events would be processed before another's 1996 ones: negative pools and
the learner's progressive order would no longer follow event time. Like Kafka Streams'
timestamp synchronisation, the aligner buffers what ``consume()`` returns per partition and
releases records in event-time order, only up to ``max_skew_ms`` past the *watermark*: the
latest timestamp seen on the slowest partition. A partition with nothing buffered that is at
its end, or silent, holds the others back for ``idle_ms`` (its next records may be in flight,
as with Kafka Streams' ``max.task.idle.ms``), then no longer until it delivers again.
Record timestamps carry event time: streamrec's producers set them.

Per partition only a prefix (in offset order) is released, so committing "last released
offset + 1" never skips a held record. A partition whose buffer fills is paused (librdkafka
then drops its prefetch and later refetches from the next unseen offset: nothing is lost).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable, Sequence

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from streamrec.kafka import position

logger = logging.getLogger(__name__)

Key = tuple[str, int]
# How long an empty partition holds the others back: long enough for a transaction's records
# to reach every partition, short against the minutes of a micro-batch (and it only delays
# records, it never throttles: they are released together).
_IDLE_MS = 2_000
# Records held per partition before it is paused: bounds memory at a few tens of MB.
_MAX_BUFFERED = 20_000


class EventTimeAligner:
    """Reorders one consumer's records into event-time order, partitions within a skew."""

    def __init__(self, consumer: Consumer, max_skew_ms: int, idle_ms: int = _IDLE_MS) -> None:
        self._consumer = consumer
        self.max_skew_ms = max_skew_ms
        self._idle_s = idle_ms / 1000
        self._buffers: dict[Key, deque[Message]] = {}
        self._head: dict[Key, int] = {}  # latest timestamp seen per partition
        self._end_since: dict[Key, float] = {}  # partitions at their end, since when
        self._stalled_since: float | None = None  # records wait on an empty partition since
        self.paused: set[Key] = set()

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Start over for a new assignment; buffered records are dropped (they are refetched
        from the committed offsets)."""
        parts = list(partitions)
        self._buffers = {(tp.topic, tp.partition): deque() for tp in parts}
        self._head.clear()
        self._end_since.clear()
        self._stalled_since = None
        self.paused.clear()
        if parts:
            self._consumer.resume(parts)  # pauses survive a rebalance in librdkafka

    def buffered(self) -> int:
        """Records held back."""
        return sum(len(b) for b in self._buffers.values())

    def push(self, messages: Sequence[Message]) -> list[Message]:
        """Take a consume() result (errors included); return the records now due, in order."""
        for msg in messages:
            topic, partition, _ = position(msg)
            key = (topic, partition)
            buffer = self._buffers.get(key)
            if buffer is None:
                continue  # a partition no longer assigned
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    self._end_since.setdefault(key, time.monotonic())
                continue
            self._end_since.pop(key, None)
            buffer.append(msg)
            ts = msg.timestamp()[1]
            if ts > self._head.get(key, -1):
                self._head[key] = ts
        released = self._release()
        self._bound_memory()
        return released

    def _watermark(self) -> int | None:
        """The slowest partition's head, or None to hold everything for now.

        A partition with nothing buffered that is at its end (or has not been heard from)
        may be about to deliver older records: while others have records waiting, it is
        waited for up to ``idle_ms``, then left out until it delivers again.
        """
        heads, empty = [], False
        for key, buffer in self._buffers.items():
            if not buffer and (key in self._end_since or key not in self._head):
                empty = True
            else:
                heads.append(self._head[key])
        if not heads:
            self._stalled_since = None
            return None
        if empty:
            now = time.monotonic()
            if self._stalled_since is None:
                self._stalled_since = now
            if now - self._stalled_since <= self._idle_s:
                return None
        self._stalled_since = None
        return min(heads)

    def _release(self) -> list[Message]:
        watermark = self._watermark()
        if watermark is None:
            return []
        limit = watermark + self.max_skew_ms
        out: list[Message] = []
        for buffer in self._buffers.values():
            while buffer and buffer[0].timestamp()[1] <= limit:
                out.append(buffer.popleft())
        out.sort(key=lambda m: m.timestamp()[1])  # stable: per-partition order holds on ties
        return out

    def _bound_memory(self) -> None:
        full = [k for k, b in self._buffers.items() if len(b) >= _MAX_BUFFERED and k not in self.paused]
        drained = [k for k in self.paused if len(self._buffers.get(k, ())) < _MAX_BUFFERED // 2]
        if full:
            self._consumer.pause([TopicPartition(t, p) for t, p in full])
            self.paused.update(full)
            logger.info("aligner paused=%s buffered=%d", sorted(self.paused), self.buffered())
        if drained:
            self._consumer.resume([TopicPartition(t, p) for t, p in drained])
            self.paused.difference_update(drained)

    def reapply(self) -> None:
        """Pause again what the aligner holds (after a caller resumed everything)."""
        if self.paused:
            self._consumer.pause([TopicPartition(t, p) for t, p in self.paused])
