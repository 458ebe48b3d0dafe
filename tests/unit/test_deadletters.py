"""Dead letters keep the failed record whole and always fit the broker's record limit."""

from __future__ import annotations

import hashlib

from streamrec.deadletters import DeadLetter
from streamrec.kafka.records import Position, Record


def test_a_dead_letter_is_the_record_itself_with_why_and_where() -> None:
    raw = b"\xff{\x01"  # invalid UTF-8 and a control byte: kept byte for byte
    msg = Record(raw, 40, topic="t", partition=2, key=b"k", timestamp=123, headers=[("h", b"v")])
    letter = DeadLetter.of(msg, "bad")
    assert letter.position == Position("t", 2, 40) and letter.key == b"k" and letter.timestamp_ms == 123
    assert letter.record_value(1024) == raw
    assert letter.record_headers(1024, written_ms=1_796_000_000_000) == [
        ("h", b"v"),
        ("streamrec.reason", b"bad"),
        ("streamrec.topic", b"t"),
        ("streamrec.partition", b"2"),
        ("streamrec.offset", b"40"),
        ("streamrec.length", b"3"),
        ("streamrec.written_ms", b"1796000000000"),  # when it failed: the timestamp is the record's
    ]


def test_a_long_value_is_cut_with_its_length_and_digest() -> None:
    raw = bytes(range(256)) * 10
    letter = DeadLetter.of(Record(raw, 0), "too long")
    assert letter.record_value(100) == raw[:100]
    headers = dict(letter.record_headers(100))
    assert headers["streamrec.length"] == b"2560"
    assert headers["streamrec.sha256"] == hashlib.sha256(raw).hexdigest().encode()


def test_a_null_value_stays_null_and_a_huge_reason_is_bounded() -> None:
    letter = DeadLetter.of(Record(None, 0), "x" * 10_000)
    assert letter.record_value(10) is None
    headers = dict(letter.record_headers(10))
    assert "streamrec.length" not in headers and len(headers["streamrec.reason"] or b"") == 1_000
