"""Each ``learner run --workers N`` marks where its run begins in every rank's log.

Paddle's launcher appends to ``learner-logs/workerlog.<rank>``: a second run's lines followed
the first's with nothing between them, and an operator reading a failure could not tell which
run a traceback belonged to (noticed in a tour).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from streamrec.cli.ranks import mark_logs

AT = datetime(2026, 12, 6, 16, 40, 5, tzinfo=UTC)


def test_each_rank_log_gets_a_line_where_the_run_begins(tmp_path: Path) -> None:
    logs = tmp_path / "learner-logs"
    mark_logs(logs, 2, AT)
    (logs / "workerlog.0").open("a").write("first run's lines\n")
    mark_logs(logs, 3, AT)
    assert (logs / "workerlog.0").read_text().splitlines() == [
        "==== learner rank 0 of 2, started 2026-12-06T16:40:05Z ====",
        "first run's lines",
        "==== learner rank 0 of 3, started 2026-12-06T16:40:05Z ====",
    ]
    third = (logs / "workerlog.2").read_text()
    assert third == "==== learner rank 2 of 3, started 2026-12-06T16:40:05Z ====\n"
