"""The runners' pure parts: the warnings of committed batches."""

from __future__ import annotations

import logging
import re

import pytest

from streamrec.consumers.native_runner import BatchLog
from streamrec.consumers.negatives import NoveltyMatchedSampler
from streamrec.consumers.processor import BatchResult
from streamrec.deadletters import DeadLetter
from streamrec.kafka.records import Position


def result(late: int = 0, dead: int = 0) -> BatchResult:
    letters = [DeadLetter(f"bad {i}", Position("ev", 0, i), b"x") for i in range(dead)]
    return BatchResult(0, NoveltyMatchedSampler(1, 1, 1), dead=letters, late=late)


def test_late_events_are_warned_of_at_most_once_a_minute_with_the_count_since(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    log = BatchLog("dlq", late=True, every_s=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="streamrec.consumers.native_runner"):
        for at, late in [(0, 3), (1, 2), (30, 0), (59, 4), (60, 1), (61, 0), (200, 0)]:
            now[0] = at
            log.add(result(late=late))
    counts = [r.args[0] for r in caplog.records if isinstance(r.args, tuple)]
    assert counts == [3, 7]  # the first at once; then what came since, a minute on; nothing when none


def test_a_flood_of_dead_letters_logs_the_first_few_of_a_minute_one_by_one_then_their_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    log = BatchLog("dlq", late=False, every_s=60.0, burst=5, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="streamrec.consumers.native_runner"):
        for at, dead in [(0, 3), (10, 4), (50, 1000), (60, 2), (130, 0), (200, 1)]:
            now[0] = at
            log.add(result(dead=dead))
    lines = [r.getMessage() for r in caplog.records]
    assert sum(line.startswith("dead letter topic=ev") for line in lines) == 5 + 2 + 1
    held = [line for line in lines if line.startswith("dead letters not logged")]
    assert [re.findall(r"held=(\d+)", line) for line in held] == [["1002"]]  # 2 of the 2nd batch, the 3rd
    assert "dlq=dlq" in held[0] and "reason='bad 0'" in lines[0]
