"""``streamrec consumers run``'s last line names the events it made nothing of as duplicates.

Publishing the same file again into a store that kept its data (``streamrec up --data-dir``,
restarted) printed ``consumed 2000 events: 0 samples, 0 dead letters``: the reason, 2,000
duplicates, was only in an INFO log line. Found on the front-door tour, 2026-12-07.
"""

from __future__ import annotations

from streamrec.cli.consumers import consumed_line
from streamrec.consumers.native_runner import ConsumerStats


def test_duplicates_are_named_on_the_last_line() -> None:
    line = consumed_line(ConsumerStats(events=2000, duplicates=2000))
    assert line == (
        "consumed 2000 events: 0 samples, 0 dead letters, "
        "2000 duplicates (event ids processed before: no samples)"
    )


def test_a_run_without_duplicates_reads_as_before() -> None:
    line = consumed_line(ConsumerStats(events=20, samples=27, dead=3))
    assert line == "consumed 20 events: 27 samples, 3 dead letters"


def test_one_of_each_is_said_in_the_singular() -> None:
    """Found by the Python-API tour, left: a run of one event said ``consumed 1 events: 1 samples,
    1 dead letters`` (``published 1 events`` likewise); mended by the carried-defects tour.
    """
    line = consumed_line(ConsumerStats(events=1, samples=1, dead=1, duplicates=1))
    assert line == (
        "consumed 1 event: 1 sample, 1 dead letter, 1 duplicate (event ids processed before: no samples)"
    )
