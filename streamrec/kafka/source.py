"""The records one Kafka consumer delivers, and the one owner of its partition state.

`RecordSource` subscribes the consumer and answers its rebalance callbacks itself; it
alone pauses and resumes partitions (the aligner's full buffers, a caller's hold during a
long training step) and seeks. Callers only poll, hold and release, put records back, and
restart from positions: no one else touches the consumer's partitions.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition

from streamrec.errors import ConsumeError
from streamrec.kafka.alignment import MAX_HOLD_MS, EventTimeAligner
from streamrec.kafka.records import Partition, Position, partition_of

logger = logging.getLogger(__name__)

# librdkafka's limit on one consume call (more is a ValueError): a poll for more, a batch or a
# micro-batch set above it, takes this much and leaves the rest to the next poll.
MAX_CONSUME = 1_000_000


class RecordSource:
    """Wraps one consumer: subscription, assignment, pauses, event-time alignment.

    ``max_skew_ms=None`` turns alignment off; ``max_hold_ms`` bounds how long it holds a
    partition back. ``start_at`` maps partitions to the next offset
    to read when they are assigned (the learner's trained positions; it is read at each
    assignment, so it may be a live dict); partitions it does not name start at the group's
    committed offset.
    """

    def __init__(
        self,
        consumer: Consumer,
        topics: Sequence[str],
        max_skew_ms: int | None,
        *,
        max_hold_ms: int = MAX_HOLD_MS,
        start_at: Mapping[Partition, int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.consumer = consumer
        self._topics = list(topics)
        self._aligner: EventTimeAligner[Message] | None = (
            None
            if max_skew_ms is None
            else EventTimeAligner(max_skew_ms, max_hold_ms=max_hold_ms, clock=clock)
        )
        self._start_at = start_at
        self._clock = clock
        self._assigned: list[Partition] = []
        self._paused: set[Partition] = set()  # what the consumer has paused now
        self._held = False  # every partition paused by hold()
        self._unread: deque[Message] = deque()  # put back by the caller, delivered first
        self._more_due = False  # the aligner held back due records at the last release
        self._last_new: float | None = None  # when new records last came out
        self._at_end: set[Partition] = set()  # read to their end: no record fetched since their EOF
        self.joined_at: float | None = None  # first assignment: before it, nobody is idle
        self.assignments = 0  # assignments received, the first one included

    # --- subscription and rebalances ------------------------------------------------

    def subscribe(self) -> None:
        """Join the group; assignments arrive during `poll`."""
        self.consumer.subscribe(self._topics, on_assign=self._on_assign, on_revoke=self._on_revoke)

    def assign(self, partitions: Sequence[Partition]) -> None:
        """Read ``partitions`` alone, outside any group rebalance (a static share)."""
        self._on_assign(self.consumer, [TopicPartition(*p) for p in partitions])

    @property
    def joined(self) -> bool:
        """Whether the group has assigned partitions yet."""
        return self.joined_at is not None

    @property
    def out_of_order(self) -> int:
        """Records alignment had to release out of event-time order (skewed timestamps)."""
        return 0 if self._aligner is None else self._aligner.forced

    def idle_for(self) -> float:
        """Seconds since new records last came out (or since the last group join).

        0 while (re)joining the group and while the aligner holds records back, still to come.
        """
        if self._last_new is None or (self._aligner is not None and self._aligner.buffered()):
            return 0.0
        return self._clock() - self._last_new

    def assigned(self) -> list[Partition]:
        """The partitions assigned now."""
        return list(self._assigned)

    def caught_up(self) -> bool:
        """Whether every assigned partition is read to its end and nothing read waits.

        As the consumer last heard (its end-of-partition events): records produced since may
        be on their way. Nothing is put back, and alignment holds nothing back.
        """
        if self._unread or (self._aligner is not None and self._aligner.buffered()):
            return False
        return bool(self._assigned) and self._at_end.issuperset(self._assigned)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self.joined_at is None:
            self.joined_at = self._clock()
        self._last_new = self._clock()  # idleness counts from each (re)join
        self.assignments += 1
        if self._start_at is not None:
            for tp in partitions:
                offset = self._start_at.get(Partition(tp.topic, tp.partition))
                if offset is not None:
                    tp.offset = offset
            consumer.assign(partitions)
        self._reset([Partition(tp.topic, tp.partition) for tp in partitions])
        logger.info("assigned partitions=%s", ",".join(str(p) for p in self._assigned))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        logger.info("revoked partitions=%s", ",".join(f"{tp.topic}[{tp.partition}]" for tp in partitions))
        self._last_new = None  # rejoining the group is not idleness
        self._reset([])

    def _reset(self, partitions: list[Partition]) -> None:
        """Forget what is buffered, put back and paused, for a new assignment."""
        self._assigned = partitions
        self._unread.clear()
        self._at_end.clear()
        if self._aligner is not None:
            self._aligner.assign(partitions)
        self._paused.clear()  # librdkafka keeps pauses across a rebalance: clear them
        if partitions:
            self.consumer.resume([TopicPartition(*p) for p in partitions])
        self._apply_pauses()

    # --- records ----------------------------------------------------------------------

    def poll(self, size: int, timeout_s: float) -> list[Message]:
        """Up to ``size`` records in event-time order (put-back records first, which may be more).

        Nothing comes while held.
        """
        if self._held:
            self.keepalive(timeout_s)
            return []
        out = list(self._unread)
        self._unread.clear()
        if len(out) >= size:
            return out
        return out + self._consume(size - len(out), timeout_s)

    def keepalive(self, timeout_s: float = 0.0) -> None:
        """Serve the consumer (group heartbeats, rebalance callbacks) without taking records.

        Anything released meanwhile is kept for the next `poll`.
        """
        self._unread.extend(self._consume(1000, timeout_s))

    def _consume(self, size: int, timeout_s: float) -> list[Message]:
        # Records already due wait in the aligner: take them without waiting for new ones.
        wait = 0.0 if self._more_due else max(0.0, timeout_s)
        messages = self.consumer.consume(min(max(1, size), MAX_CONSUME), wait)
        records: list[Message] = []
        at_end: list[Partition] = []
        for msg in messages:
            err = msg.error()
            if err is None:
                records.append(msg)
                if self._at_end:  # most batches: nothing at its end, nothing to look up
                    self._at_end.discard(partition_of(msg))
            elif err.code() == KafkaError._PARTITION_EOF:
                at_end.append(partition_of(msg))
                self._at_end.add(at_end[-1])
            elif err.fatal():
                raise ConsumeError(f"consumer failed: {err.str()}")
            else:
                logger.warning("consumer error=%s", err.str())
        if self._aligner is not None:
            records = self._aligner.push(records, at_end, limit=size)
            self._more_due = len(records) >= size
            self._apply_pauses()
        if records:
            self._last_new = self._clock()
        return records

    def unread(self, records: Iterable[Message]) -> None:
        """Put records back: the next `poll` delivers them first, in this order."""
        self._unread.extendleft(reversed(list(records)))

    def unread_floor(self) -> dict[Partition, int]:
        """The lowest offset put back per partition: positions must not pass it."""
        floor: dict[Partition, int] = {}
        for msg in self._unread:
            pos = Position.of(msg)
            if pos.offset < floor.get(pos.key, pos.offset + 1):
                floor[pos.key] = pos.offset
        return floor

    # --- pauses and seeks ---------------------------------------------------------------

    def hold(self) -> None:
        """Pause every partition (e.g. while a long training step runs).

        Keep calling `keepalive` to stay in the group.
        """
        self._held = True
        self._apply_pauses()

    def release(self) -> None:
        """Undo `hold`; the aligner's own pauses stay."""
        self._held = False
        self._apply_pauses()

    def _apply_pauses(self) -> None:
        want = set(self._assigned) if self._held else set()
        if self._aligner is not None:
            want |= self._aligner.full() & set(self._assigned)
        if pause := want - self._paused:
            self.consumer.pause([TopicPartition(*p) for p in pause])
            if not self._held:
                logger.info("aligner paused=%s", ",".join(str(p) for p in sorted(pause)))
        if resume := self._paused - want:
            self.consumer.resume([TopicPartition(*p) for p in resume])
        self._paused = want

    def has_committed_offsets(self, timeout_s: float) -> bool:
        """Whether the group has committed offsets on any partition of the topics.

        That is, whether it processed records before.
        """
        return any(offset >= 0 for offset in self.committed_offsets(timeout_s).values())

    def committed_offsets(
        self, timeout_s: float, partitions: Sequence[Partition] | None = None
    ) -> dict[Partition, int]:
        """The group's committed offset on each of ``partitions`` (by default every one of the topics).

        Negative where it committed none.
        """
        parts = self._partitions(timeout_s) if partitions is None else partitions
        return group_offsets(self.consumer, parts, timeout_s)

    def _partitions(self, timeout_s: float) -> list[Partition]:
        """Every partition of the topics, as the broker's metadata has them now."""
        parts = []
        for topic in self._topics:
            meta = self.consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
            parts += [Partition(topic, p) for p in sorted(meta.partitions if meta else ())]
        return parts

    def start_positions(self, known: Mapping[Partition, int], timeout_s: float) -> dict[Partition, int]:
        """The next offset to read for each partition of the topics that ``known`` does not name.

        The group's committed offset, else the partition's first (never before it).

        Given to ``start_at``, this makes every assignment start where the owner of ``known``
        left off, even for a partition another member of the group read and committed
        meanwhile.
        """
        unknown = [TopicPartition(*key) for key in self._partitions(timeout_s) if key not in known]
        committed = self.consumer.committed(unknown, timeout=timeout_s) if unknown else []
        positions: dict[Partition, int] = {}
        for tp in committed:
            key = Partition(tp.topic, tp.partition)
            low, _ = self.consumer.get_watermark_offsets(TopicPartition(*key), timeout=timeout_s)
            positions[key] = max(tp.offset, low)
        return positions

    def seek(self, offsets: Mapping[Partition, int]) -> None:
        """Start over from ``offsets``.

        Drop what is buffered or put back and read each assigned partition from ``offsets``
        (the beginning where an offset is unknown or negative).
        """
        partitions = self.assigned()
        self._reset(partitions)
        for key in partitions:
            offset = offsets.get(key, -1)
            self.consumer.seek(TopicPartition(*key, offset if offset >= 0 else OFFSET_BEGINNING))

    def close(self) -> None:
        """Leave the group."""
        self.consumer.close()


class IdleClock:
    """When a loop reading a source should stop for lack of input.

    ``limit_s`` after the source last had new records and the loop last finished work, counted
    only once ``upstream_done`` (if given) is set, so a slow producer (a consumer still joining
    its group, say) does not end the run early. ``limit_s`` None never stops.
    """

    def __init__(
        self,
        limit_s: float | None,
        source: RecordSource,
        upstream_done: threading.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Watch ``source``."""
        self._limit_s = limit_s
        self._source = source
        self._upstream = upstream_done
        self._clock = clock
        self._idle_since = clock()
        self._upstream_since: float | None = None

    def busy(self) -> None:
        """Work just finished (a batch, a training step, a retry): idleness counts from now."""
        self._idle_since = self._clock()

    def expired(self) -> bool:
        """Whether the run should stop now."""
        if self._limit_s is None:
            return False
        now = self._clock()
        idle = min(self._source.idle_for(), now - self._idle_since)
        if self._upstream is not None:
            if not self._upstream.is_set():
                return False
            if self._upstream_since is None:
                self._upstream_since = now
            idle = min(idle, now - self._upstream_since)
        return idle > self._limit_s


def group_offsets(
    consumer: Consumer, partitions: Sequence[Partition], timeout_s: float
) -> dict[Partition, int]:
    """The committed offsets of ``consumer``'s group on ``partitions`` (negative: none).

    Raises:
        KafkaException: the broker did not answer (a passing failure: the runners retry it).
    """
    if not partitions:
        return {}
    committed = consumer.committed([TopicPartition(*key) for key in partitions], timeout=timeout_s)
    return {Partition(tp.topic, tp.partition): tp.offset for tp in committed}
