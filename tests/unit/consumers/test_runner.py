"""The runners' pure parts: the late-event warning."""

from __future__ import annotations

import logging

import pytest

from streamrec.consumers.runner import LateLog


def test_late_events_are_warned_of_at_most_once_a_minute_with_the_count_since(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    log = LateLog(every_s=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="streamrec.consumers.runner"):
        for at, late in [(0, 3), (1, 2), (30, 0), (59, 4), (60, 1), (61, 0), (200, 0)]:
            now[0] = at
            log.add(late)
    counts = [r.args[0] for r in caplog.records if isinstance(r.args, tuple)]
    assert counts == [3, 7]  # the first at once; then what came since, a minute on; nothing when none
