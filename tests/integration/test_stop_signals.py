"""SIGTERM to a command while it imports Paddle, or after, from outside.

Paddle's import sets its own C++ handler on SIGTERM process-wide, and the handler allocates: a
SIGTERM that landed in malloc deadlocked the process in the handler (``streamrec serve`` and
``streamrec score`` hung until SIGKILL, seen under py-spy in ``paddle::framework::SignalHandle``
waiting on malloc's lock), and one that did not printed a C++ "FatalError" trace
(``streamrec replay backtest``, every try). A command that sets no handler of its own now ends
quietly, as any process ends on SIGTERM; one that sets its own (``serve``) uses it once set.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import pytest

from streamrec.local.ports import free_port
from tests.conftest import MOVIELENS
from tests.support import paddle_handlers_set, running, trained_snapshots, wait_for


def stopped_as_paddle_loads(
    command: list[str],
    delay_s: float,
    log: Path,
    in_child: bool = False,
    to_command: bool = False,
    signum: signal.Signals = signal.SIGTERM,
) -> tuple[int | None, str]:
    """Run ``streamrec COMMAND``, send ``signum`` ``delay_s`` after Paddle's handlers appear.

    The signal goes to the command, or with ``in_child`` to the first of its child processes in
    which Paddle's handlers appear (``to_command`` as well: to the command, once they appear there).

    Returns:
        The command's exit code (negative: the signal that ended it; None: it hung 30 s and was
        killed) and its output.
    """
    with log.open("wb") as out:
        proc = subprocess.Popen(  # in the log's folder: what it leaves there (learner-logs/) goes with it
            [sys.executable, "-m", "streamrec", *command], stdout=out, stderr=subprocess.STDOUT,
            cwd=log.parent,
        )
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "Paddle never imported"
            targets = psutil.Process(proc.pid).children() if in_child else [psutil.Process(proc.pid)]
            loaded = [t for t in targets if paddle_handlers_set(t.pid)]
            if loaded:
                break
            time.sleep(0.002)
        time.sleep(delay_s)
        (psutil.Process(proc.pid) if to_command else loaded[0]).send_signal(signum)
        try:
            return proc.wait(30), log.read_text()
        except subprocess.TimeoutExpired:
            return None, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("delay_s", [0.0, 0.05, 2.0], ids=["at-import", "in-import", "training"])
def test_a_backtest_stopped_with_sigterm_ends_quietly(tmp_path: Path, delay_s: float) -> None:
    command = ["replay", "backtest", str(MOVIELENS), "--strategies", "finetune", "--limit", "30000"]
    code, output = stopped_as_paddle_loads(command, delay_s, tmp_path / "backtest.log")
    assert code == -signal.SIGTERM and "FatalError" not in output, (code, output[-3000:])


@pytest.mark.parametrize("delay_s", [0.0, 0.05, 0.3], ids=["at-import", "in-import", "loading"])
def test_serve_stopped_with_sigterm_as_it_starts_ends_quietly(tmp_path: Path, delay_s: float) -> None:
    trained_snapshots(tmp_path / "snapshots", count=1).promote(1)
    snapshots = str(tmp_path / "snapshots")
    command = ["serve", "--no-store", "--snapshot-dir", snapshots, "--port", str(free_port())]
    code, output = stopped_as_paddle_loads(command, delay_s, tmp_path / "serve.log")
    # Ended by the signal before its handler is set (uvicorn's, after the load), cleanly after.
    assert code in (0, -signal.SIGTERM) and "FatalError" not in output, (code, output[-3000:])


def test_a_backtests_strategy_process_stopped_with_sigterm_ends_quietly(tmp_path: Path) -> None:
    """``--jobs 2``: each strategy's process imports Paddle itself, not through the command's entry;
    the command then ends with one line naming the strategy, not a traceback.
    """
    command = ["replay", "backtest", str(MOVIELENS), "--strategies", "finetune,ewc", "--jobs", "2"]
    command += ["--limit", "30000"]
    code, output = stopped_as_paddle_loads(command, 0.0, tmp_path / "backtest.log", in_child=True)
    assert "FatalError" not in output and "Traceback" not in output, output[-3000:]
    assert code == 1 and "error: " in output and "process" in output, (code, output[-3000:])


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("delay_s", [0.0, 0.05], ids=["at-import", "in-import"])
def test_learner_workers_stopped_as_their_launcher_imports_paddle_end_quietly(
    tmp_path: Path, delay_s: float, signum: signal.Signals
) -> None:
    """``learner run --workers 2`` passes the signal on to Paddle's launcher, whose import of Paddle
    set Paddle's SIGTERM handler in it until the launcher set its own: a FatalError trace, or a
    hang; a SIGINT then was a KeyboardInterrupt traceback.
    """
    command = ["learner", "run", "--workers", "2", "--bootstrap-servers", f"127.0.0.1:{free_port()}"]
    command += ["--snapshot-dir", str(tmp_path / "snapshots")]
    code, output = stopped_as_paddle_loads(
        command, delay_s, tmp_path / "learner.log", in_child=True, to_command=True, signum=signum
    )
    assert "FatalError" not in output and "Traceback" not in output, output[-3000:]
    assert code == 0 and "stopped on request" in output, (code, output[-3000:])


def test_a_backtests_strategy_processes_end_with_a_command_killed_outright(tmp_path: Path) -> None:
    """A kill -9 of ``replay backtest --jobs 2`` (or the OOM killer) leaves no strategy process
    training on, unseen, for a command that can no longer take its run.
    """
    command = [sys.executable, "-m", "streamrec", "replay", "backtest", str(MOVIELENS)]
    command += ["--strategies", "finetune,ewc", "--jobs", "2"]
    log = tmp_path / "backtest.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 90
        while True:  # both strategies' processes have Paddle loaded: they are training
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the strategies' processes never loaded Paddle"
            children = psutil.Process(proc.pid).children()
            if len([c for c in children if paddle_handlers_set(c.pid)]) == 2:
                break
            time.sleep(0.05)
        time.sleep(3)  # past reading their micro-batches, which a dead command's pipe would end
        proc.kill()
        proc.wait()
        wait_for(lambda: not running(children), 10, "the strategies' processes ending")
        # Not by finishing first: one that did raised BrokenPipeError, its run lost.
        assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
    finally:  # the command's processes only: the session's broker and Redis are this process's too
        for process in [psutil.Process(proc.pid), *children] if proc.poll() is None else children:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
