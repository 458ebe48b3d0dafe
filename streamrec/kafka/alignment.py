"""Event-time alignment across the partitions one consumer reads.

A consumer catching up on a backlog gets long runs of one partition before the next, so one
group of users' 2016 events would be processed before another's 1996 ones: negative pools and
the learner's progressive order would no longer follow event time. Like Kafka Streams'
timestamp synchronisation, the aligner buffers records per partition and releases them in
event-time order, only up to ``max_skew_ms`` past the *watermark*: the latest timestamp seen
on the slowest partition. A partition with nothing buffered that is at its end, or silent,
holds the others back for ``idle_ms`` (its next records may be in flight, as with Kafka
Streams' ``max.task.idle.ms``), then no longer until it delivers again.
Record timestamps carry event time: streamrec's producers set them.

Records come out as a merge of the partitions by event time, each partition in offset order,
at most as many as asked for: what is released is a prefix of every partition, so committing
"last released offset + 1" never skips a held record. The aligner is pure logic: it never touches a
consumer. It names the partitions whose buffers are full (:meth:`EventTimeAligner.full`),
and the owner of the consumer pauses them.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Generic, TypeVar

from streamrec.kafka.records import KafkaMessage, Partition, event_time

M = TypeVar("M", bound=KafkaMessage)

# How long an empty partition holds the others back: long enough for a transaction's records
# to reach every partition, short against the minutes of a micro-batch (and it only delays
# records, it never throttles: they are released together).
IDLE_MS = 2_000
# Records held per partition before it should be paused: bounds memory at a few tens of MB.
MAX_BUFFERED = 20_000


class EventTimeAligner(Generic[M]):
    """Reorders one consumer's records into event-time order, partitions within a skew."""

    def __init__(
        self,
        max_skew_ms: int,
        *,
        idle_ms: int = IDLE_MS,
        max_buffered: int = MAX_BUFFERED,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Align within ``max_skew_ms``; ``clock`` (seconds) times the idle wait."""
        self.max_skew_ms = max_skew_ms
        self._idle_s = idle_ms / 1000
        self._max_buffered = max_buffered
        self._clock = clock
        self._buffers: dict[Partition, deque[M]] = {}
        self._head: dict[Partition, int] = {}  # latest timestamp seen per partition
        self._at_end: set[Partition] = set()  # partitions at their end, nothing since
        self._stalled_since: float | None = None  # records wait on an empty partition since
        self._full: set[Partition] = set()

    def assign(self, partitions: Iterable[Partition]) -> None:
        """Start over for a new assignment; buffered records are dropped (the owner refetches
        them from its positions)."""
        self._buffers = {Partition(*p): deque() for p in partitions}
        self._head.clear()
        self._at_end.clear()
        self._stalled_since = None
        self._full.clear()

    def buffered(self) -> int:
        """Records held back."""
        return sum(len(b) for b in self._buffers.values())

    def full(self) -> set[Partition]:
        """Partitions to keep paused: their buffers filled up and have not drained to half."""
        for key, buffer in self._buffers.items():
            if len(buffer) >= self._max_buffered:
                self._full.add(key)
            elif len(buffer) < self._max_buffered // 2:
                self._full.discard(key)
        return set(self._full)

    def push(
        self, records: Sequence[M], at_end: Iterable[Partition] = (), limit: int | None = None
    ) -> list[M]:
        """Take newly consumed records and the partitions found at their end after them;
        return up to ``limit`` records now due, merged in event-time order."""
        for msg in records:
            key = Partition(msg.topic() or "", msg.partition() or 0)
            buffer = self._buffers.get(key)
            if buffer is None:
                continue  # a partition no longer assigned
            self._at_end.discard(key)
            buffer.append(msg)
            ts = event_time(msg)
            if ts > self._head.get(key, -1):
                self._head[key] = ts
        self._at_end.update(key for key in at_end if key in self._buffers)
        return self._release(limit)

    def _watermark(self) -> int | None:
        """The slowest partition's head, or None to hold everything for now.

        A partition with nothing buffered that is at its end (or has not been heard from)
        may be about to deliver older records: while others have records waiting, it is
        waited for up to ``idle_ms``, then left out until it delivers again.
        """
        heads, empty = [], False
        for key, buffer in self._buffers.items():
            if not buffer and (key in self._at_end or key not in self._head):
                empty = True
            else:
                heads.append(self._head[key])
        if not heads:
            self._stalled_since = None
            return None
        if empty:
            now = self._clock()
            if self._stalled_since is None:
                self._stalled_since = now
            if now - self._stalled_since <= self._idle_s:
                return None
        self._stalled_since = None
        return min(heads)

    def _release(self, limit: int | None) -> list[M]:
        """Merge the partitions' heads up to the watermark plus the skew, earliest first."""
        watermark = self._watermark()
        if watermark is None:
            return []
        horizon = watermark + self.max_skew_ms
        # (head time, partition number, buffer): the number breaks ties in assignment order.
        heads = [(event_time(b[0]), n, b) for n, b in enumerate(self._buffers.values()) if b]
        heads = [h for h in heads if h[0] <= horizon]
        heapq.heapify(heads)
        out: list[M] = []
        while heads and (limit is None or len(out) < limit):
            _, n, buffer = heapq.heappop(heads)
            out.append(buffer.popleft())
            if buffer and (ts := event_time(buffer[0])) <= horizon:
                heapq.heappush(heads, (ts, n, buffer))
        return out
