"""The dead-letter contract: a record that broke its topic's contract, kept whole, with why.

A dead letter is the failed record itself, as Kafka Connect's dead-letter queues keep it: the
same key, value bytes, timestamp and headers, plus ``streamrec.*`` headers that say why and
where it came from. Nothing is re-encoded, so any bytes (invalid UTF-8, control characters)
survive byte for byte. A value longer than the limit is cut to it, with the full length and
the sha256 of the whole value in headers, so a dead letter always fits the broker's record
size limit and the original can still be identified.

Headers added (values are UTF-8 text):

- ``streamrec.reason``: what was wrong, e.g. ``not valid JSON: ...``;
- ``streamrec.topic``, ``streamrec.partition``, ``streamrec.offset``: where it was read;
- ``streamrec.length``: the original value's length in bytes (absent for a null value);
- ``streamrec.sha256``: the original value's sha256, only when the value was cut;
- ``streamrec.written_ms``: when the letter was written, epoch milliseconds (the record's own
  timestamp stays the failed record's, so this is what orders letters by when they failed).
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from streamrec.kafka.records import Header, KafkaMessage, Position

HEADER_PREFIX = "streamrec."
# A reason is ours and short; this bounds one built from a huge exception message.
_MAX_REASON_CHARS = 1_000


# Dead-letter reasons are free text with values in them (sizes, ids); a label takes one of
# these few kinds instead, so the series stay few. The first pattern that matches wins.
# tests/unit/test_dead_letter_kinds.py holds every reason the code writes, with its kind.
REASONS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), kind)
    for pattern, kind in (
        (r"^empty record", "null_value"),
        (r"^record is \d+ bytes", "too_large"),
        (r"^not valid JSON", "not_json"),
        (r"^expected a JSON object", "not_object"),
        (r"^missing field", "missing_field"),
        (r"^feature '.*' is required: field '.*' is missing", "missing_field"),
        (r"^field 'ts'.* in the future", "future_timestamp"),
        (r"^field 'ts'", "bad_timestamp"),
        (r"^field 'label'", "bad_label"),
        # a sample's history (the learner's): not ids of the event, the consumers' making
        (r"^field 'seq_|^sequences differ in length", "bad_sequence"),
        (r"^field '", "bad_id"),
        # a declared feature's value (`streamrec.features`); the learner's, declared otherwise
        (r"^feature '.*' is declared .* the consumers declare it otherwise", "feature_mismatch"),
        (r"^feature '", "bad_feature"),
        (r"^event id .* reused", "conflicting_event_id"),
        (r"^late event", "late"),
        (r"^record has no key", "no_key"),
        (r"^record key .* is not the event's user_id", "wrong_key"),
        (r"^user .* belongs in .* partitioner", "wrong_partition"),
    )
)
#: The kind of a reason no pattern knows.
OTHER_REASON = "other"
#: Every kind, in the order of the patterns, then `OTHER_REASON`.
KINDS: tuple[str, ...] = (*dict.fromkeys(kind for _, kind in REASONS), OTHER_REASON)


def reason_kind(reason: str) -> str:
    """The dead-letter kind of a reason.

    The ``reason`` label of the consumers' dead-letter counter, and what ``streamrec consumers
    dead-letters`` counts by.
    """
    return next((kind for pattern, kind in REASONS if pattern.search(reason)), OTHER_REASON)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record that broke the contract, with the reason, on its way to a dead-letter topic."""

    reason: str
    position: Position
    value: bytes | None
    key: bytes | None = None
    timestamp_ms: int = 0
    headers: tuple[Header, ...] = ()

    @classmethod
    def of(cls, msg: KafkaMessage, reason: str) -> DeadLetter:
        """The dead letter of a consumed record."""
        return cls(
            reason=reason[:_MAX_REASON_CHARS],
            position=Position.of(msg),
            value=msg.value(),
            key=msg.key(),
            timestamp_ms=msg.timestamp()[1],
            headers=header_list(msg),
        )

    def record_value(self, max_bytes: int) -> bytes | None:
        """The value to produce: the original bytes, cut to ``max_bytes`` if longer."""
        return None if self.value is None else self.value[:max_bytes]

    def record_headers(self, max_bytes: int, written_ms: int | None = None) -> list[Header]:
        """The original headers, then the ``streamrec.*`` context headers, written now by default."""
        context = {
            "reason": self.reason,
            "topic": self.position.topic,
            "partition": str(self.position.partition),
            "offset": str(self.position.offset),
        }
        if self.value is not None:
            context["length"] = str(len(self.value))
            if len(self.value) > max_bytes:
                context["sha256"] = hashlib.sha256(self.value).hexdigest()
        context["written_ms"] = str(int(time.time() * 1000) if written_ms is None else written_ms)
        return [*self.headers, *((HEADER_PREFIX + k, v.encode()) for k, v in context.items())]


def header_list(msg: KafkaMessage) -> tuple[Header, ...]:
    """A record's headers as (name, bytes) pairs, in order (a consumed record's already are)."""
    raw = msg.headers() or ()
    pairs = raw.items() if isinstance(raw, dict) else raw
    return tuple((name, v.encode() if isinstance(v, str) else v) for name, v in pairs)


class DeadLetterLog:
    """The warnings of dead letters, rate-limited.

    One each for the first ``burst`` of every ``every_s`` seconds, and the rest counted, their
    number logged when the next period begins. A producer bug can send bad records by the
    hundred thousand; one line each buried the log (and cost the writer), while the dead-letter
    topic and the counts keep every one.
    """

    def __init__(
        self, logger: logging.Logger, dlq_topic: str, *, burst: int = 20, every_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Log to ``logger`` of letters bound for ``dlq_topic``."""
        self._logger, self._topic = logger, dlq_topic
        self._burst, self._every_s, self._clock = burst, every_s, clock
        self._period: float | None = None  # when this period began
        self._shown = 0  # letters logged one by one in it
        self._held = 0  # and those only counted

    def add(self, letters: Sequence[DeadLetter]) -> None:
        """Log the dead letters of a batch (written, or committed with it)."""
        if not letters:
            return
        now = self._clock()
        if self._period is None or now - self._period >= self._every_s:
            if self._held:
                self._logger.warning(
                    "dead letters not logged one by one held=%d dlq=%s (in the %gs before; each is "
                    "on the dead-letter topic with its reason)", self._held, self._topic, self._every_s,
                )
            self._period, self._shown, self._held = now, 0, 0
        for letter in letters:
            if self._shown == self._burst:
                self._held += 1
                continue
            self._shown += 1
            pos = letter.position
            self._logger.warning(
                "dead letter topic=%s partition=%d offset=%d dlq=%s reason=%r",
                pos.topic, pos.partition, pos.offset, self._topic, letter.reason,
            )
