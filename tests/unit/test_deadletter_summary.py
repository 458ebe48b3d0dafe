"""Dead letters read back: their headers understood, counted by the metric's kinds, their values
written one a line to fix and publish again, and never a value left out without a count.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from streamrec.cli.consumers import _IDLE_S
from streamrec.deadletter_reader import IDLE_S, Reading
from streamrec.deadletter_summary import StoredLetter, Summary, one_line, since_ms, summarise, value_line
from streamrec.deadletters import KINDS, DeadLetter
from streamrec.errors import ConfigError
from streamrec.kafka.records import Position, Record
from streamrec.observability.consumer import ConsumerMetrics

EVENT = orjson.dumps({"event_id": "e1", "user_id": "u1", "item_id": "i1", "category_id": "c1",
                      "action": "pv", "ts": 1_700_000_000_000})


def stored(
    value: bytes | None, reason: str, offset: int = 0, max_bytes: int = 1 << 20, at: int = 0
) -> StoredLetter:
    """``value`` dead-lettered as the consumers do, then read back from the dead-letter topic."""
    letter = DeadLetter.of(
        Record(value, offset, topic="events", partition=1, timestamp=1_700_000_000_000 + offset), reason
    )
    record = Record(
        letter.record_value(max_bytes), at, topic="events.dlq", partition=0, timestamp=letter.timestamp_ms,
        headers=letter.record_headers(max_bytes),
    )
    return StoredLetter.of(record)


def test_a_letter_read_back_says_why_where_from_and_whether_it_was_cut() -> None:
    letter = stored(b"{bad", "not valid JSON: oops", offset=7, at=3)
    assert letter.reason == "not valid JSON: oops" and letter.kind == "not_json"
    assert letter.source == Position("events", 1, 7) and letter.at == Position("events.dlq", 0, 3)
    assert letter.value == b"{bad" and letter.length == 4 and not letter.cut
    assert letter.example()["time"] == "2023-11-14T22:13:20.007Z"

    big = b"x" * 100
    cut = stored(big, "record is 100 bytes, over the 10-byte limit", max_bytes=10)
    assert cut.cut and cut.length == 100 and cut.value == big[:10] and cut.kind == "too_large"
    assert one_line(cut.value, cut.length) == "xxxxxxxxxx… (100 bytes)"
    assert hashlib.sha256(big).hexdigest()  # the header is there: cut is read from it

    foreign = StoredLetter.of(Record(b"{}", 0, topic="dlq"))  # another tool's record: no headers
    assert foreign.source is None and foreign.kind == "other" and "no streamrec.reason" in foreign.reason


def test_the_kinds_are_the_metrics_reason_labels() -> None:
    metrics = ConsumerMetrics()
    labels = {s.labels["reason"] for m in metrics.registry.collect()
              if m.name == "streamrec_consumer_dead_letters" for s in m.samples}
    assert labels == set(KINDS)


def test_a_summary_counts_by_kind_keeps_the_first_examples_and_counts_duplicates() -> None:
    summary = Summary("events.dlq", examples=2)
    letters = [stored(b"{bad%d" % n, "not valid JSON", offset=n) for n in range(5)]
    letters += [stored(EVENT, "record has no key: ...", offset=10), stored(b"{bad0", "not valid JSON")]
    assert [summary.add(x) for x in letters] == [True] * 6 + [False]
    doc = summary.doc()
    assert doc["dead_letters"] == 7 and doc["duplicates"] == 1
    assert doc["by_reason"] == {"not_json": 5, "no_key": 1}  # most first
    assert [e["offset"] for e in doc["examples"]["not_json"]] == [0, 1]
    assert doc["first_time"] == "2023-11-14T22:13:20.000Z" and doc["last_time"] == "2023-11-14T22:13:20.010Z"
    lines = summary.lines()
    assert lines[0].startswith("7 dead letters in events.dlq (1 duplicate), record times")
    assert lines[1].split() == ["5", "not_json"] and "events[1]@0" in lines[2] and lines[3].strip() == "{bad0"
    assert Summary("t").lines() == ["no dead letters in t"]


def test_values_are_lines_and_what_cannot_be_one_is_left_out_with_why() -> None:
    assert value_line(stored(EVENT, "x")) == (EVENT, "")
    pretty = orjson.dumps(orjson.loads(EVENT), option=orjson.OPT_INDENT_2)
    line, _ = value_line(stored(pretty.replace(b"\n", b"\r\n"), "x"))
    assert line is not None and b"\n" not in line and orjson.loads(line) == orjson.loads(EVENT)
    assert value_line(stored(b"{not json", "x")) == (b"{not json", "")  # to fix by hand
    assert value_line(stored(b"{not\njson", "x")) == (None, "multiline")
    assert value_line(stored(None, "x")) == (None, "null")
    assert value_line(stored(b"\xff\xfe", "x")) == (None, "not_text")
    assert value_line(stored(b"\x01" * 20, "x")) == (None, "not_text")
    assert value_line(stored(EVENT + b" " * 100, "x", max_bytes=len(EVENT))) == (None, "cut")


def test_the_values_file_holds_each_failed_record_once_and_is_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / "dead.jsonl"
    path.write_bytes(b"old\n")
    letters = [stored(EVENT, "no key", 1), stored(None, "empty record", 2),
               stored(b"\xff", "not valid JSON", 3), stored(EVENT, "no key", 1)]
    summary, values = summarise(letters, "dlq", path)
    assert values is not None and values.written == 1 and dict(values.skipped) == {"null": 1, "not_text": 1}
    assert path.read_bytes() == EVENT + b"\n" and summary.duplicates == 1
    assert values.line(path) == (
        f"wrote 1 value to {path}; left out 2: null (tombstones): 1; not text (not UTF-8, or control "
        "characters): 1"
    )
    assert not list(tmp_path.glob(".*.tmp"))

    def failing() -> list[StoredLetter]:
        raise RuntimeError("broker gone")

    with pytest.raises(RuntimeError):
        summarise((x for x in [letters[0], *failing()]), "dlq", path)
    assert path.read_bytes() == EVENT + b"\n" and not list(tmp_path.glob(".*.tmp"))  # left as it was
    with pytest.raises(ConfigError, match="cannot write"):
        summarise(letters, "dlq", tmp_path / "missing" / "dead.jsonl")


def test_since_is_a_time_ago_or_an_iso_time() -> None:
    now = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)
    assert since_ms("2h", now) == int(datetime(2026, 12, 7, 8, 0, tzinfo=UTC).timestamp() * 1000)
    assert since_ms("2026-12-07T09:30:00Z", now) == since_ms("30m", now)
    assert since_ms("2026-12-07T09:30:00", now) == since_ms("30m", now)  # UTC unless said
    assert since_ms("2026-12-07T10:30:00+01:00", now) == since_ms("30m", now)
    with pytest.raises(ConfigError, match="neither a time ago"):
        since_ms("yesterday", now)


def test_a_reading_refuses_what_cannot_be_read() -> None:
    with pytest.raises(ConfigError, match="--kind bogus: not a kind of reason"):
        Reading("t", kinds=frozenset({"bogus"}))
    with pytest.raises(ConfigError, match="--limit"):
        Reading("t", limit=0)
    with pytest.raises(ConfigError, match="--idle"):
        Reading("t", idle_s=float("nan"))
    assert _IDLE_S == IDLE_S  # the CLI's default, written there for a fast --help
