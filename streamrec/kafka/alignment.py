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
"last released offset + 1" never skips a held record.

Alignment assumes each partition is roughly in event-time order. A record stamped far ahead
of the records behind it in its own partition (a skewed clock) would hold them all back for
as long as traffic flows, so it is released at once, out of order. And no partition is held
longer than ``max_hold_ms`` of wall-clock time. Both count as forced releases
(`EventTimeAligner.forced`) and are logged.

The aligner is pure logic: it never touches a consumer. It names the partitions whose
buffers are full (`EventTimeAligner.full`), and the owner of the consumer pauses them.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Generic, TypeVar

from streamrec.kafka.records import KafkaMessage, Partition, event_time, partition_of

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=KafkaMessage)

# How long an empty partition holds the others back: long enough for a transaction's records
# to reach every partition, short against the minutes of a micro-batch (and it only delays
# records, it never throttles: they are released together).
IDLE_MS = 2_000
# Records held per partition before it should be paused: bounds memory at a few tens of MB.
MAX_BUFFERED = 20_000
# The longest a partition is held back (wall clock). Catching up, event time runs far faster
# than the clock, so an aligned partition waits seconds; five minutes only passes when event
# times are off, and then order matters less than not stalling.
MAX_HOLD_MS = 300_000
# At most one warning per partition this often: forced releases can come in runs.
_WARN_EVERY_S = 60.0


class EventTimeAligner(Generic[M]):
    """Reorders one consumer's records into event-time order, partitions within a skew."""

    def __init__(
        self,
        max_skew_ms: int,
        *,
        idle_ms: int = IDLE_MS,
        max_buffered: int = MAX_BUFFERED,
        max_hold_ms: int = MAX_HOLD_MS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Align within ``max_skew_ms``; ``clock`` (seconds) times the waits."""
        self.max_skew_ms = max_skew_ms
        self._idle_s = idle_ms / 1000
        self._max_buffered = max_buffered
        self._max_hold_s = max_hold_ms / 1000
        self._clock = clock
        self.forced = 0  # records released out of event-time order (see the module doc)
        self._held_since: dict[Partition, float] = {}
        self._warned_at: dict[Partition, float] = {}
        self._buffers: dict[Partition, deque[M]] = {}
        self._head: dict[Partition, int] = {}  # latest timestamp seen per partition
        self._at_end: set[Partition] = set()  # partitions at their end, nothing since
        self._stalled_since: float | None = None  # records wait on an empty partition since
        self._waited: set[Partition] = set()  # waited for idle_ms: left out until they deliver
        self._full: set[Partition] = set()

    def assign(self, partitions: Iterable[Partition]) -> None:
        """Start over for a new assignment.

        Buffered records are dropped (the owner refetches them from its positions).
        """
        self._buffers = {Partition(*p): deque() for p in partitions}
        self._head.clear()
        self._at_end.clear()
        self._stalled_since = None
        self._waited.clear()
        self._full.clear()
        self._held_since.clear()

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
        """Take newly consumed records and the partitions found at their end after them.

        Return up to ``limit`` records now due, merged in event-time order.
        """
        buffers, head = self._buffers, self._head
        arrived: set[Partition] = set()
        for msg in records:
            key = partition_of(msg)
            buffer = buffers.get(key)
            if buffer is None:
                continue  # a partition no longer assigned
            arrived.add(key)
            buffer.append(msg)
            ts = msg.timestamp()[1]
            if ts > head.get(key, -1):
                head[key] = ts
        self._at_end -= arrived
        self._waited -= arrived
        self._at_end.update(key for key in at_end if key in self._buffers)
        return self._release(limit)

    def _watermark(self) -> int | None:
        """The slowest partition's head, or None to hold everything for now.

        A partition with nothing buffered that is at its end (or has not been heard from)
        may be about to deliver older records: while others have records waiting, it is
        waited for up to ``idle_ms``, then left out until it delivers again.
        """
        heads, empty = [], []
        for key, buffer in self._buffers.items():
            if not buffer and (key in self._at_end or key not in self._head):
                if key not in self._waited:
                    empty.append(key)
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
            self._waited.update(empty)
        self._stalled_since = None
        return min(heads)

    def _release(self, limit: int | None) -> list[M]:
        """Merge the partitions' heads up to the watermark plus the skew, earliest first."""
        watermark = self._watermark()
        if watermark is None:
            return []
        horizon = watermark + self.max_skew_ms
        bounds = self._bounds(horizon)
        out: list[M] = []
        # (head time, partition number, key): the number breaks ties in assignment order.
        heads: list[tuple[int, int, Partition]] = []
        for n, key in enumerate(self._buffers):
            self._push_head(heads, n, key, bounds[key], horizon, out)
        heapq.heapify(heads)
        room = math.inf if limit is None else limit
        while heads and len(out) < room:
            ts, n, key = heads[0]
            buffer = self._buffers[key]
            out.append(buffer.popleft())
            if ts > horizon:
                self._count_forced(key, "held too long", ts, horizon)
            if buffer and (ts := buffer[0].timestamp()[1]) <= horizon:  # the common case, in one step
                heapq.heapreplace(heads, (ts, n, key))
            else:
                heapq.heappop(heads)
                self._push_head(heads, n, key, bounds[key], horizon, out)
        return out

    def _push_head(
        self, heads: list[tuple[int, int, Partition]], n: int, key: Partition, bound: float,
        horizon: int, out: list[M],
    ) -> None:
        """Queue a partition's head if it is due.

        A head beyond the horizon that an earlier record of its own partition follows is an
        outlier and goes out at once.
        """
        buffer = self._buffers[key]
        ahead = max(horizon, bound)
        while len(buffer) > 1 and event_time(buffer[0]) > ahead and event_time(buffer[1]) <= horizon:
            out.append(buffer.popleft())
            self._count_forced(key, "ahead of its own partition", event_time(out[-1]), horizon)
        if buffer and (ts := event_time(buffer[0])) <= bound:
            heapq.heappush(heads, (ts, n, key))

    def _bounds(self, horizon: int) -> dict[Partition, float]:
        """How far each partition may be released.

        The horizon, or all of it once its head has been held back longer than ``max_hold_ms``.
        """
        now = self._clock()
        bounds: dict[Partition, float] = {}
        for key, buffer in self._buffers.items():
            bounds[key] = horizon
            if buffer and event_time(buffer[0]) > horizon:
                if now - self._held_since.setdefault(key, now) > self._max_hold_s:
                    bounds[key] = math.inf
            else:
                self._held_since.pop(key, None)
        return bounds

    def _count_forced(self, key: Partition, why: str, ts: int, horizon: int) -> None:
        self.forced += 1
        now = self._clock()
        if now - self._warned_at.get(key, -math.inf) >= _WARN_EVERY_S:
            self._warned_at[key] = now
            logger.warning(
                "alignment released out of order partition=%s why=%r ts=%d horizon=%d forced=%d",
                key, why, ts, horizon, self.forced,
            )
