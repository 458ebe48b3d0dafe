"""``streamrec learner run --workers N``: N learner ranks under ``paddle.distributed.launch``.

Outside a launch, ``--workers N`` starts ``python -m streamrec.launch --nproc_per_node N
<streamrec> <the same arguments>`` (Paddle's launcher: `streamrec.launch`) and waits for it;
each rank it starts (``PADDLE_TRAINERS_NUM`` set) runs `streamrec.learner.ranked.RankedRunner`.
Across hosts the operator runs that launch command on each host (with ``--ips`` or
``--master``), and the command line needs no ``--workers``. Rank 0 alone serves metrics,
exports and promotes, judging the group's micro-batch (every rank scores its own samples by
the served version for it).
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from streamrec.cli.common import console, err_console
from streamrec.errors import ConfigError
from streamrec.orphans import end_with_parent

if TYPE_CHECKING:
    from streamrec.config import StreamrecConfig
    from streamrec.kafka.records import Partition
    from streamrec.learner.base import Learner
    from streamrec.learner.reports import MicroBatchReport
    from streamrec.learner.runner import LearnerStats
    from streamrec.observability import LearnerMetrics
    from streamrec.serving.gate import Promoter
    from streamrec.snapshots.store import SnapshotManifest, SnapshotStore


def launched() -> bool:
    """Whether this process is a rank started by ``paddle.distributed.launch``."""
    from streamrec.learner.ranks import launched_world

    return launched_world()[1] > 1


def mark_logs(log_dir: Path, workers: int, now: datetime) -> None:
    """Begin this run in each rank's log with a line: the launcher appends to the last run's."""
    log_dir.mkdir(parents=True, exist_ok=True)
    started = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for rank in range(workers):
        with (log_dir / f"workerlog.{rank}").open("a") as log:
            log.write(f"==== learner rank {rank} of {workers}, started {started} ====\n")


def launch_workers(workers: int, log_dir: Path = Path("learner-logs")) -> int:
    """Run this command as ``workers`` ranks on this host; the launcher's exit status.

    Each rank's log goes to ``log_dir/workerlog.<rank>``, appended to after a line that marks
    this run's start (`mark_logs`); rank 0's is shown here too. SIGINT
    and SIGTERM are passed on to the launcher, which stops the ranks as one learner stops (the
    micro-batch in hand finished; each rank signalled once: `streamrec.launch`); the status is
    then 0. A second one stops them at once, and the launcher kills those it outwaits. A rank
    that failed (killed, lost its peers, refused the snapshot directory) stops the group: after
    the launcher's report (the rank, its status, the end of its log) one error line, status 1.
    """
    script = Path(sys.executable).with_name("streamrec")
    if not script.is_file():
        raise ConfigError(
            f"--workers needs the streamrec script beside {sys.executable} (pip install streamrec), "
            "which paddle.distributed.launch runs once per rank"
        )
    command = [
        sys.executable,
        "-m",
        "streamrec.launch",
        "--nproc_per_node",
        str(workers),
        "--log_dir",
        str(log_dir),
        str(script),
        *sys.argv[1:],
    ]
    console.print(f"starting {workers} learner ranks; their logs: {log_dir}/workerlog.<rank>")
    try:
        mark_logs(log_dir, workers, datetime.now(UTC))
    except OSError as exc:  # the launcher would fail on it too, with a traceback
        raise ConfigError(f"cannot write the ranks' logs in {log_dir}: {exc.strerror or exc}") from exc
    requested: list[int] = []
    launcher: subprocess.Popen[bytes] | None = None

    def forward(signum: int, _: object) -> None:
        requested.append(signum)
        if launcher is not None:
            launcher.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        # Its own process group, so that a Ctrl-C reaches the launcher once (forwarded), not
        # twice (the second makes it kill the ranks mid-step); and it stops if this process dies.
        launcher = subprocess.Popen(  # noqa: S603 - our own command
            command, process_group=0, preexec_fn=functools.partial(end_with_parent, os.getpid())
        )
        for signum in requested:  # any that came before it started
            launcher.send_signal(signum)
        returncode = launcher.wait()
    finally:
        for sig, handler in previous.items():  # None: a handler not set from Python (Paddle's)
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
    # The launcher exits with the signal's number; stopped before it set its handler, by the signal.
    if requested and returncode in (requested[0], -requested[0]):
        console.print("the learner ranks stopped on request")
        return 0
    if returncode == 0:
        return 0
    # The launcher's status is its first failed rank's, as sys.exit made it (-9: 247): say what it means.
    err_console.print(
        f"[red]error:[/red] the learner ranks stopped with an error (the launcher's status {returncode}; "
        f"the failed rank and the end of its log are above, every rank's log in {log_dir}/workerlog.<rank>): "
        "nothing past the last snapshot was committed: start the group again, it resumes from there",
        highlight=False,
    )
    return 1


def run_rank(
    cfg: StreamrecConfig,
    learner: Learner,
    store: SnapshotStore,
    promoter: Promoter,
    metrics: LearnerMetrics,
    on_snapshot: Callable[[SnapshotManifest], None],
    serve: Callable[[Callable[[], Mapping[Partition, int]]], None],
) -> tuple[LearnerStats, SnapshotManifest | None]:
    """Run this rank of the launched group until it stops: its totals, and the snapshot resumed.

    Rank 0 alone observes the reports and snapshots in ``metrics``, calls ``on_snapshot`` (the
    export and promotion) and ``serve`` (``/metrics``, with the lag of the group's positions,
    which rank 0 holds after each micro-batch); the others only train and score.
    """
    from streamrec.cli.common import print_report, stop_on_signals
    from streamrec.cli.learner import take_up_resumed
    from streamrec.learner.ranked import RankedRunner
    from streamrec.learner.ranks import RankGroup, launched_world
    from streamrec.learner.trainer import TableLearner
    from streamrec.loopsettings import before_training_loop

    if not isinstance(learner, TableLearner):
        raise ConfigError(f"several learner ranks need a table model, not {cfg.model.learner!r}")
    rank, world = launched_world()
    group = RankGroup(rank, world, cfg.learner.rank_timeout_s)
    lead = {}
    if rank == 0:

        def on_report(report: MicroBatchReport) -> None:
            metrics.observe_report(report)
            print_report(report)

        lead = {"on_report": on_report, "on_snapshot": on_snapshot, "snapshots": store}
    console.print(f"learner rank {rank} of {world}")
    before_training_loop()
    # every rank's promoter scores its own samples by the served version; rank 0's judges
    # the group left as the run ends, before the interpreter's exit (`RankGroup.close`)
    with group, RankedRunner(cfg, learner, group, gate=promoter, **lead) as runner:
        if rank == 0:  # rank 0's gate judges
            take_up_resumed(runner, promoter, metrics, store, serve)
        # a stop lets a wait on the others finish (on Paddle's TCP store, which fails an interrupted read)
        return runner.run(stop_on_signals(restart_calls=True)), runner.resumed
