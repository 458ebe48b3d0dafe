"""A dead-letter topic read to its end, without disturbing the pipeline.

`DeadLetterReader` assigns itself the topic's partitions (it joins no consumer group and commits
nothing, so no consumer's position or group membership changes) and reads them from their start,
from a time, or their last records, up to their ends as of when it began: the high-water marks
then, or the end of a partition reached before (dead letters keep coming while it reads; those
are left to the next reading). It also stops after ``idle_s`` with no record: a broker whose
high-water marks are wrong (the embedded Tansu's can be) would otherwise keep it waiting.
"""

from __future__ import annotations

import heapq
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from streamrec.config import KafkaConfig
from streamrec.deadletter_summary import EXAMPLES, StoredLetter, Summary, ValuesFile, summarise
from streamrec.deadletters import KINDS
from streamrec.errors import ConfigError, ConsumeError
from streamrec.kafka.clients import make_consumer, require_broker
from streamrec.kafka.topics import topic_partitions

logger = logging.getLogger(__name__)

# Without a record for this long the reader stops, short of the ends if it must: a broker hands
# out a local topic's records in milliseconds, and the wait only guards against wrong ends.
IDLE_S = 5.0
# Metadata, watermark and time-index requests: a broker answers in milliseconds.
_TIMEOUT_S = 10.0
# Records per consume call: dead letters are small, and the loop only counts them.
_BATCH = 1_000


@dataclass(frozen=True)
class Reading:
    """What to read of a dead-letter topic.

    ``since_ms``: only letters whose record time (the failed record's own timestamp, which a
    dead letter keeps) is at or after it; ``limit``: only the last ``limit`` letters written
    (the latest by their ``streamrec.written_ms`` of each partition's last ``limit``; by record
    time for a letter without it), of which those of ``kinds``; ``idle_s``: stop after so long
    without a record.
    """

    topic: str
    since_ms: int | None = None
    limit: int | None = None
    idle_s: float = IDLE_S
    kinds: frozenset[str] = frozenset()  # only letters of these kinds of reason (empty: all)

    def __post_init__(self) -> None:
        """Refuse a limit below 1, an idle time that is not positive and a kind that is none."""
        if unknown := sorted(self.kinds - set(KINDS)):
            raise ConfigError(
                f"--kind {', '.join(unknown)}: not a kind of reason; one of {', '.join(KINDS)}"
            )
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"--limit must be 1 or more, not {self.limit}")
        if not self.idle_s > 0:  # nan too
            raise ConfigError(f"--idle must be a positive number of seconds, not {self.idle_s}")


@dataclass
class DeadLetterReader:
    """Reads ``reading``'s letters with a client of ``cfg``'s (its bootstrap servers and options)."""

    cfg: KafkaConfig
    reading: Reading
    clock: Callable[[], float] = time.monotonic
    #: After `letters`: the partitions left short of their end by the idle stop: (position, end).
    short: dict[int, tuple[int, int]] = field(default_factory=dict)

    def letters(self) -> Iterator[StoredLetter]:
        """The letters, in the order read (in the order written under a ``limit``).

        Raises:
            ServiceError: no broker answers.
            ConsumeError: the topic does not exist, or the broker fails a request.
        """
        require_broker(self.cfg)
        # a group id is required by the client; assign() never joins it, and nothing commits
        consumer = make_consumer(
            self.cfg, f"streamrec-dead-letters-{uuid.uuid4().hex[:8]}", **{"enable.partition.eof": True}
        )
        try:
            ranges = self._ranges(consumer)
            kinds = self.reading.kinds
            letters = (x for x in self._read(consumer, ranges) if not kinds or x.kind in kinds)
            if self.reading.limit is None:
                yield from letters
            else:
                newest = heapq.nlargest(self.reading.limit, letters, key=_written_order)
                yield from sorted(newest, key=_written_order)
        finally:
            consumer.close()

    def _ranges(self, consumer: Consumer) -> dict[int, tuple[int, int]]:
        """Each partition's first offset to read and its end now: (start, end)."""
        topic = self.reading.topic
        try:
            partitions = topic_partitions(consumer, topic, _TIMEOUT_S)
        except ConsumeError as exc:
            if "does not exist" not in str(exc):
                raise
            raise ConsumeError(
                f"dead-letter topic {topic} does not exist on the brokers: check its name "
                "(STREAMREC_KAFKA__DLQ_TOPIC, --dlq-topic; STREAMREC_KAFKA__SAMPLES_DLQ_TOPIC, "
                "--samples-dlq-topic); the consumers and the learner create theirs when they start"
            ) from None
        try:
            marks = {
                p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=_TIMEOUT_S, cached=False)
                for p in partitions
            }
            since = self._since(consumer, partitions)
        except KafkaException as exc:
            raise ConsumeError(f"cannot read the offsets of {topic}: {exc}") from exc
        ranges = {}
        for p, (low, high) in marks.items():
            start = max(low, 0)
            if self.reading.limit is not None:
                start = max(start, high - self.reading.limit)
            if p in since:
                start = max(start, high if since[p] < 0 else since[p])
            ranges[p] = (start, high)
        return ranges

    def _since(self, consumer: Consumer, partitions: list[int]) -> dict[int, int]:
        """Each partition's first offset of a record at or after ``since_ms`` (-1: none)."""
        if self.reading.since_ms is None:
            return {}
        asked = [TopicPartition(self.reading.topic, p, self.reading.since_ms) for p in partitions]
        return {tp.partition: tp.offset for tp in consumer.offsets_for_times(asked, timeout=_TIMEOUT_S)}

    def _read(self, consumer: Consumer, ranges: dict[int, tuple[int, int]]) -> Iterator[StoredLetter]:
        """Each partition's records from its start to its end (`_Progress`)."""
        topic, since = self.reading.topic, self.reading.since_ms
        progress = _Progress(consumer, topic, ranges)
        last = self.clock()
        while progress.reading:
            messages = consumer.consume(_BATCH, min(self.reading.idle_s, 1.0))
            if messages:
                last = self.clock()
            elif self.clock() - last >= self.reading.idle_s:
                self.short = progress.short()
                logger.warning(
                    "no dead letter for %gs: stopped short of the ends (high-water marks) topic=%s %s",
                    self.reading.idle_s, topic,
                    " ".join(f"[{p}]={at}/{end}" for p, (at, end) in self.short.items()),
                )
                return
            for msg in messages:
                if progress.take(msg) and (since is None or msg.timestamp()[1] >= since):
                    yield StoredLetter.of(msg)


class _Progress:
    """Where each partition's reading is, and where it ends.

    A partition ends at the later of its high-water mark at the start and the one the first
    fetch of its records tells (the embedded broker answers the first with its last batch's
    first offset: 1 for a partition of one batch of 3 records; the fetch tells 3), or at the
    end reached first. Every partition is read, even one that seems empty, for the same reason.
    """

    def __init__(self, consumer: Consumer, topic: str, ranges: dict[int, tuple[int, int]]) -> None:
        """Assign ``consumer`` each partition of ``topic`` at its start in ``ranges``."""
        self._consumer, self._topic = consumer, topic
        self.reading = {p: start for p, (start, _) in ranges.items()}  # the partitions left: next offset
        self._ends = {p: end for p, (_, end) in ranges.items()}
        self._fetched: set[int] = set()  # partitions whose end a fetch has told
        consumer.assign([TopicPartition(topic, p, start) for p, start in self.reading.items()])

    def take(self, msg: Message) -> bool:
        """Whether ``msg`` is a record to read; a partition leaves `reading` at its end."""
        p, err = msg.partition() or 0, msg.error()
        if p not in self.reading:
            return False
        if err is not None:
            if err.code() != KafkaError._PARTITION_EOF:
                raise ConsumeError(f"reading the dead-letter topic {self._topic} failed: {err.str()}")
            del self.reading[p]  # its end, reached before the mark
            return False
        if p not in self._fetched:
            self._fetched.add(p)
            _, high = self._consumer.get_watermark_offsets(TopicPartition(self._topic, p), cached=True)
            self._ends[p] = max(self._ends[p], high)
        offset = msg.offset() or 0
        if offset >= self._ends[p]:  # written since the start: left to the next reading
            del self.reading[p]
            return False
        self.reading[p] = offset + 1
        if offset + 1 >= self._ends[p]:
            del self.reading[p]
        return True

    def short(self) -> dict[int, tuple[int, int]]:
        """The partitions short of their end: (next offset, end)."""
        return {p: (at, self._ends[p]) for p, at in self.reading.items() if at < self._ends[p]}


def _written_order(letter: StoredLetter) -> tuple[int, int, int, int]:
    """When a letter was written, then (a batch's letters share the millisecond) its record time."""
    written = letter.written_ms if letter.written_ms is not None else letter.timestamp_ms
    return written, letter.timestamp_ms, letter.at.partition, letter.at.offset


@dataclass
class Survey:
    """A dead-letter topic's letters counted, and their values written where asked."""

    summary: Summary
    values: ValuesFile | None
    short: dict[int, tuple[int, int]]  # see `DeadLetterReader.short`


def survey(
    cfg: KafkaConfig, reading: Reading, values: Path | None = None, examples: int = EXAMPLES
) -> Survey:
    """Read ``reading``'s letters and count them; with ``values``, write their values there.

    See `streamrec.deadletter_summary.summarise`.

    Raises:
        ServiceError: no broker answers.
        ConsumeError: the topic does not exist, or the broker fails a request.
        ConfigError: ``values`` cannot be written.
    """
    reader = DeadLetterReader(cfg, reading)
    summary, written = summarise(reader.letters(), reading.topic, values, examples)
    return Survey(summary, written, reader.short)
