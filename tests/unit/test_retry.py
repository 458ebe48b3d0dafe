"""Backoff: doubling pauses, capped, until the deadline after the first failure."""

from __future__ import annotations

from streamrec.retry import Backoff


def test_pauses_double_up_to_the_cap_and_stop_at_the_deadline() -> None:
    now = [0.0]
    retry = Backoff(30.0, clock=lambda: now[0])
    pauses = []
    while (pause := retry.next_pause()) is not None:
        pauses.append(pause)
        now[0] += pause
    assert pauses == [0.5, 1, 2, 4, 8, 10, 4.5]  # the last one ends at the deadline
    assert sum(pauses) == 30.0


def test_a_zero_deadline_gives_up_at_once() -> None:
    assert Backoff(0.0).next_pause() is None


def test_a_started_backoff_counts_its_deadline_from_the_start() -> None:
    now = [0.0]
    backoff = Backoff(2.0, clock=lambda: now[0])
    backoff.start()
    now[0] = 1.5  # the first try took 1.5 s
    assert backoff.next_pause() == 0.5
    now[0] = 2.0
    assert backoff.next_pause() is None
