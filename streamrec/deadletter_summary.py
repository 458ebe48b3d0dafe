"""Dead letters read back: what each says, counts by kind of reason, and their values as a file.

`StoredLetter` is a record of a dead-letter topic (`streamrec.deadletters` wrote it: the failed
record whole, ``streamrec.*`` headers saying why and where from). `Summary` counts them by the
kinds of `streamrec.deadletters.reason_kind` (the ``reason`` label of
``streamrec_consumer_dead_letters_total``), with a few examples of each. `write_values` writes
their values one a line, for an operator to fix and publish again (`streamrec produce FILE`).

Pure: no client; `streamrec.deadletter_reader` reads the topic.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from streamrec.deadletters import HEADER_PREFIX, header_list, reason_kind
from streamrec.errors import ConfigError
from streamrec.fileio import atomic_file
from streamrec.kafka.records import KafkaMessage, Position
from streamrec.wording import plural

# A few of each kind show what is wrong; the counts say how many.
EXAMPLES = 3
# An example's value on one line of a terminal, beside its place and time.
VALUE_CHARS = 100
# Control characters but tab and the line feed, escaped in an example's one line.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
# Control characters but tab and line breaks: a value with them is binary junk, not an event to fix.
_BINARY = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_LINE_BREAKS = re.compile(rb"[\r\n]")

#: Why a value is not in the written file, by what `value_line` says.
SKIPS = {
    "null": "null (tombstones)",
    "cut": "cut to the dead-letter size limit (only their start was kept)",
    "not_text": "not text (not UTF-8, or control characters)",
    "multiline": "text over several lines, not JSON",
}


@dataclass(frozen=True, slots=True)
class StoredLetter:
    """A dead letter as its topic holds it.

    ``source``: where the failed record was read (None when a header is missing: a record
    some other tool wrote); ``at``: where the letter is in the dead-letter topic;
    ``length``: the failed value's whole length in bytes; ``cut``: the value kept is only its
    start (it was over ``STREAMREC_CONSUMER__DEAD_LETTER_MAX_BYTES``); ``written_ms``: when the
    letter was written (None for a letter written before that header was).
    """

    reason: str
    source: Position | None
    at: Position
    timestamp_ms: int
    value: bytes | None
    length: int | None = None
    cut: bool = False
    written_ms: int | None = None

    @classmethod
    def of(cls, msg: KafkaMessage) -> StoredLetter:
        """The dead letter a record of a dead-letter topic holds."""
        ours = {
            name[len(HEADER_PREFIX):]: (raw.decode(errors="replace") if isinstance(raw, bytes) else raw or "")
            for name, raw in header_list(msg)
            if name.startswith(HEADER_PREFIX)
        }
        value = msg.value()
        length = _int(ours.get("length"))
        return cls(
            reason=ours.get("reason") or "(no streamrec.reason header)",
            source=_source(ours),
            at=Position(msg.topic() or "", msg.partition() or 0, msg.offset() or 0),
            timestamp_ms=msg.timestamp()[1],
            value=value,
            length=length,
            cut="sha256" in ours or (value is not None and length is not None and length > len(value)),
            written_ms=_int(ours.get("written_ms")),
        )

    @property
    def kind(self) -> str:
        """The kind of its reason (`streamrec.deadletters.reason_kind`)."""
        return reason_kind(self.reason)

    def example(self) -> dict[str, Any]:
        """What `Summary` shows of it: where from, when, why, the value on one line."""
        source = self.source
        return {
            "topic": source.topic if source else None,
            "partition": source.partition if source else None,
            "offset": source.offset if source else None,
            "time": iso_time(self.timestamp_ms),
            "reason": self.reason,
            "value": one_line(self.value, self.length),
        }


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def _source(headers: dict[str, str]) -> Position | None:
    partition, offset = _int(headers.get("partition")), _int(headers.get("offset"))
    if "topic" not in headers or partition is None or offset is None:
        return None
    return Position(headers["topic"], partition, offset)


def iso_time(ms: int) -> str | None:
    """A record time as ISO 8601 UTC to the millisecond; None for none (-1, 0)."""
    if ms <= 0:
        return None
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def one_line(value: bytes | None, length: int | None = None, chars: int = VALUE_CHARS) -> str:
    """A value on one line, cut to ``chars`` with its whole length said.

    Control characters and bytes that are not UTF-8 are escaped.

    Examples:
        >>> one_line(b"x" * 120, chars=5)
        'xxxxx… (120 bytes)'
        >>> one_line(None)
        '(null)'
    """
    if value is None:
        return "(null)"
    text = value[: chars * 4].decode("utf-8", "backslashreplace")
    text = _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(), text.replace("\n", "\\n"))
    whole = length if length is not None else len(value)
    if len(text) > chars or whole > len(value):
        return f"{text[:chars]}… ({whole:,} bytes)"
    return text


@dataclass
class KindCount:
    """The dead letters of one kind of reason: how many, and the first few."""

    count: int = 0
    examples: list[StoredLetter] = field(default_factory=list)


class Summary:
    """Dead letters counted by kind of reason, with the first ``examples`` of each.

    A letter of a record already counted (the same source topic, partition and offset: the
    learner's dead-letter topic is at-least-once, and so are the Faust runner's) is counted
    as a duplicate only.
    """

    def __init__(self, topic: str, examples: int = EXAMPLES) -> None:
        """Count the dead letters of ``topic``."""
        self.topic, self._examples = topic, examples
        self.kinds: dict[str, KindCount] = {}
        self.letters = self.duplicates = 0
        self.first_ms: int | None = None
        self.last_ms: int | None = None
        # the records counted, by source topic: partition and offset in one int (a Position
        # each: 300 MB peak for 564,000 letters, not 227 MB)
        self._seen: dict[str, set[int]] = {}

    def add(self, letter: StoredLetter) -> bool:
        """Count ``letter``; False for a duplicate."""
        self.letters += 1
        if letter.source is not None:
            seen = self._seen.setdefault(letter.source.topic, set())
            key = letter.source.partition << 48 | letter.source.offset  # offsets stay below 2**48
            if key in seen:
                self.duplicates += 1
                return False
            seen.add(key)
        counted = self.kinds.setdefault(letter.kind, KindCount())
        counted.count += 1
        if len(counted.examples) < self._examples:
            counted.examples.append(letter)
        if letter.timestamp_ms > 0:
            self.first_ms = min(self.first_ms or letter.timestamp_ms, letter.timestamp_ms)
            self.last_ms = max(self.last_ms or 0, letter.timestamp_ms)
        return True

    def by_count(self) -> list[tuple[str, KindCount]]:
        """The kinds, most frequent first."""
        return sorted(self.kinds.items(), key=lambda item: (-item[1].count, item[0]))

    def doc(self) -> dict[str, Any]:
        """As one JSON document (``--json``)."""
        return {
            "topic": self.topic,
            "dead_letters": self.letters,
            "duplicates": self.duplicates,
            "first_time": iso_time(self.first_ms or 0),
            "last_time": iso_time(self.last_ms or 0),
            "by_reason": {kind: counted.count for kind, counted in self.by_count()},
            "examples": {kind: [e.example() for e in counted.examples] for kind, counted in self.by_count()},
        }

    def lines(self) -> list[str]:
        """As text: one line of totals, then per kind its count and examples, indented."""
        if not self.letters:
            return [f"no dead letters in {self.topic}"]
        span = f", record times {iso_time(self.first_ms or 0)} to {iso_time(self.last_ms or 0)}"
        dupes = f" ({plural(self.duplicates, 'duplicate', grouped=True)})" if self.duplicates else ""
        letters = plural(self.letters, "dead letter", grouped=True)
        out = [f"{letters} in {self.topic}{dupes}{span if self.first_ms else ''}"]
        for kind, counted in self.by_count():
            out.append(f"{counted.count:>8}  {kind}")
            for letter in counted.examples:
                e = letter.example()
                where = f"{e['topic']}[{e['partition']}]@{e['offset']}" if letter.source else "?"
                out.append(f"          {where}  {e['time'] or '-'}  {e['reason']}")
                out.append(f"            {e['value']}")
        return out


def value_line(letter: StoredLetter) -> tuple[bytes | None, str]:
    """The line of ``letter``'s value in a values file, or None and why not (a `SKIPS` key).

    A JSON value is written byte for byte but for its line breaks, which JSON allows only
    between tokens: as spaces it is the same document on one line. Text that is not JSON is
    written as it is, when it is one line, for the operator to fix (`streamrec produce` names
    its line until then).
    """
    value = letter.value
    if value is None:
        return None, "null"
    if letter.cut:
        return None, "cut"
    try:
        text = value.decode()
    except UnicodeDecodeError:
        return None, "not_text"
    if _BINARY.search(text):
        return None, "not_text"
    try:
        orjson.loads(value)
    except orjson.JSONDecodeError:
        return (None, "multiline") if _LINE_BREAKS.search(value) else (value, "")
    return _LINE_BREAKS.sub(b" ", value), ""


class ValuesFile:
    """The values of dead letters, one a line (`value_line`), written to an open file."""

    def __init__(self, out: BinaryIO) -> None:
        """Write to ``out``."""
        self._out = out
        self.written = 0
        self.skipped: Counter[str] = Counter()  # letters left out, by why (`SKIPS` keys)

    def add(self, letter: StoredLetter) -> None:
        """Write ``letter``'s value, or count why not."""
        line, why = value_line(letter)
        if line is None:
            self.skipped[why] += 1
            return
        self._out.write(line + b"\n")
        self.written += 1

    def line(self, path: Path) -> str:
        """What was written, and what left out, on one line."""
        left = "; ".join(f"{SKIPS[why]}: {self.skipped[why]:,}" for why in SKIPS if self.skipped[why])
        wrote = f"wrote {plural(self.written, 'value', grouped=True)} to {path}"
        return f"{wrote}; left out {self.skipped.total():,}: {left}" if left else wrote


def summarise(
    letters: Iterable[StoredLetter], topic: str, values: Path | None = None, examples: int = EXAMPLES
) -> tuple[Summary, ValuesFile | None]:
    """Count ``letters``; with ``values``, write their values there (`ValuesFile`).

    Once per failed record (a duplicate's is left out); the file is replaced at the end, never
    left torn.

    Raises:
        ConfigError: ``values`` cannot be written.
    """
    summary = Summary(topic, examples)
    if values is None:
        for letter in letters:
            summary.add(letter)
        return summary, None
    try:
        with atomic_file(values) as fh:
            out = ValuesFile(fh)
            for letter in letters:
                if summary.add(letter):
                    out.add(letter)
    except OSError as exc:
        raise ConfigError(f"cannot write {values}: {exc.strerror or exc}") from exc
    return summary, out


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def since_ms(text: str, now: datetime) -> int:
    """``--since`` as epoch milliseconds.

    A time ago (``90s``, ``30m``, ``2h``, ``1d``) or an ISO 8601 time (UTC unless it says otherwise).

    Raises:
        ConfigError: neither.
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", text)
    if match is not None:
        when = now - timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])
    else:
        try:
            when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(
                f"--since {text!r} is neither a time ago (90s, 30m, 2h, 1d) nor an ISO 8601 time "
                "(2026-12-07T10:00:00Z)"
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)
