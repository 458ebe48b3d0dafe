"""Events whose record breaks the events topic's partitioning, told apart before any is stored.

The consumers rely on each user's events coming through one partition (see
`streamrec.kafka.partitioning`). A record without a key, keyed by something other than
its event's user (a session, a device), or put in another partition than the shared
partitioner gives its key (a producer on another client's default) breaks that: the user's
events would be processed out of order, by two consumers at once, and in the ``join`` mode a
click would miss its impression's window, so the impression would be labelled a negative and
the click a positive of its own. Such records go to the dead-letter topic whole, with the
reason and what to change, like any other record that breaks the event contract.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Sequence

from streamrec.config import Partitioner
from streamrec.consumers.partitioner_judge import HOW, PartitionerJudge
from streamrec.errors import PartitionerMismatch
from streamrec.events import Event
from streamrec.kafka.partitioning import partitions_of
from streamrec.kafka.records import KafkaMessage, Partition

#: What every reason ends with: the rule, and why it matters.
RULE = "the events topic is keyed by user_id, so that each user's events come through one partition"
#: How many bytes of a wrong key a reason quotes.
KEY_QUOTE_BYTES = 64
_PARTITION = operator.itemgetter(1)  # Partition.partition, read in C
logger = logging.getLogger(__name__)
_HOW = {name: f" ({how})" for name, how in HOW.items()}


class Placement:
    """Checks that each record came through the partition its key belongs in.

    Checks each event's record against ``partitioner`` and the partition counts of the
    topics read, which the runner keeps up to date (`counts`, at each assignment).
    """

    def __init__(self, partitioner: Partitioner) -> None:
        """Check records by ``partitioner``; `counts` must name each topic read."""
        self.partitioner = partitioner
        self.counts: dict[str, int] = {}  # topic -> its partitions, as of the last assignment
        # whether misplaced records say the producers use another partitioner (checked only on
        # the misplaced path; see `streamrec.consumers.partitioner_judge`)
        self.judge = PartitionerJudge(partitioner)
        self._hinted = False  # the one warning that names the other partitioner

    def check(self) -> None:
        """Stop the consumers once misplaced records say the producers use another partitioner.

        Raises:
            PartitionerMismatch: they do (`PartitionerJudge.verdict`).
        """
        if self.judge.verdict is not None:
            raise PartitionerMismatch(self.judge.verdict)

    def misplaced(self, events: Sequence[tuple[Event, KafkaMessage, Partition]]) -> dict[int, str]:
        """The events whose record is misplaced, by index into ``events``, with the reason.

        Each topic's records are checked as whole lists (most batches are all in place, and hold
        one topic), record by record only where the lists differ.

        Raises:
            ValueError: a record's topic has no partition count in `counts`.
        """
        users = [event.user_id.encode() for event, _, _ in events]
        record_keys = [msg.key() for _, msg, _ in events]
        where = [key for _, _, key in events]
        reasons: dict[int, str] = {}
        if record_keys != users:
            for index, (record_key, user) in enumerate(zip(record_keys, users, strict=True)):
                if record_key != user:
                    reasons[index] = _key_reason(record_key, events[index][0].user_id)
        partitions = set(where)
        topics = {key.topic for key in partitions}
        for topic in topics:
            count = self.counts.get(topic)
            if count is None:
                raise ValueError(f"no partition count for {topic}: the runner sets it at each assignment")
            if count == 1:
                continue
            if len(topics) == 1:  # a runner's batches: no list copied
                indexes: Sequence[int] = range(len(events))
                keys, places = users, where
            else:
                indexes = [i for i, key in enumerate(where) if key.topic == topic]
                keys, places = [users[i] for i in indexes], [where[i] for i in indexes]
            wanted = partitions_of(keys, count, self.partitioner)
            actual = list(map(_PARTITION, places))
            if wanted == actual:
                self.judge.in_place(partitions if len(topics) == 1 else set(places))  # settled: per batch
                continue
            judge, other = self.judge, partitions_of(keys, count, self.judge.other)  # misplaced path only
            for index, right, got, elsewhere in zip(indexes, wanted, actual, other, strict=True):
                judge.record(where[index], right == got, elsewhere == got)
                if right != got and index not in reasons:  # a wrong key says it first
                    reasons[index] = self._reason(events[index][0].user_id, where[index], right, count) + (
                        self._hint() if elsewhere == got else ""
                    )
        return reasons

    def _reason(self, user: str, key: Partition, wanted: int, count: int) -> str:
        return (
            f"user {user!r} belongs in {Partition(key.topic, wanted)} by the {self.partitioner} "
            f"partitioner over {count} partitions, not {key}: {RULE}. Every producer must "
            f"partition by {self.partitioner}{_HOW[self.partitioner]}, or "
            "STREAMREC_KAFKA__PARTITIONER name the one they share"
        )

    def _hint(self) -> str:
        """What a misplaced record where the other partitioner puts it adds to its reason; warned once."""
        other = self.judge.other
        if not self._hinted:
            self._hinted = True
            logger.warning(
                "misplaced events are where the %s partitioner puts their keys (%s), not %s "
                "(STREAMREC_KAFKA__PARTITIONER): they are dead-lettered. If every producer of the events "
                "topic partitions by %s, set STREAMREC_KAFKA__PARTITIONER=%s; the consumers stop once %d of "
                "a partition's first records are so, with none only %s puts there",
                other, HOW[other], self.partitioner, other, other, self.judge.stop_after, self.partitioner,
            )
        return f" ({other} puts it there: STREAMREC_KAFKA__PARTITIONER={other} if every producer uses it)"


def _key_reason(record_key: bytes | None, user: str) -> str:
    if record_key is None:
        return f"record has no key: {RULE} (publish with key=user_id)"
    return f"record key {record_key[:KEY_QUOTE_BYTES]!r} is not the event's user_id {user!r}: {RULE}"

