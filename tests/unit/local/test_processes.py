"""Process helpers: pid files, liveness, reliable stop, log tails."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamrec.local.processes import (
    log_tail,
    pid_alive,
    pid_matches,
    read_pid,
    spawn,
    stop_pid,
    write_pid,
)

_SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]
_IGNORE_TERM = [
    sys.executable,
    "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(60)",
]


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_pid_file_round_trip_and_garbage(tmp_path: Path) -> None:
    path = tmp_path / "x.pid"
    assert read_pid(path) is None
    write_pid(path, 4242)
    assert read_pid(path) == 4242
    for garbage in ("not a pid", "0", "-1", ""):
        path.write_text(garbage)
        assert read_pid(path) is None, garbage


def test_group_pids_are_refused() -> None:
    for pid in (0, -1):
        with pytest.raises(ValueError, match="not a single process"):
            pid_alive(pid)
        with pytest.raises(ValueError, match="not a single process"):
            stop_pid(pid)


def test_liveness_and_identity() -> None:
    assert pid_alive(os.getpid())
    assert not pid_alive(_dead_pid())
    assert not pid_matches(os.getpid(), "redis-server")  # alive but someone else
    assert not pid_matches(_dead_pid(), "")


def test_owned_process_stops(tmp_path: Path) -> None:
    proc = spawn("sleeper", _SLEEP, tmp_path / "s.log", detached=False, stop_signal=signal.SIGTERM)
    assert proc.alive()
    proc.stop(timeout_s=5)
    assert not proc.alive()
    proc.stop()  # idempotent


def test_owned_services_end_with_their_owner_killed_outright(tmp_path: Path) -> None:
    """Killed with -9 (or crashed: librdkafka's segfault), a test session or a demo left its broker
    and Redis running, orphaned (seen here: seven pairs after a day of such runs). Owned services
    started from the main thread now end with their owner; detached ones (`streamrec up`) live on.
    """
    owner = subprocess.Popen(
        [sys.executable, "-c", (
            "import signal, sys, time\n"
            "from pathlib import Path\n"
            "from streamrec.local.processes import spawn\n"
            f"sleep = {_SLEEP!r}\n"
            "log = Path(sys.argv[1])\n"
            "owned = spawn('owned', sleep, log / 'o.log', detached=False, stop_signal=signal.SIGTERM)\n"
            "kept = spawn('kept', sleep, log / 'k.log', detached=True, stop_signal=signal.SIGTERM)\n"
            "print(owned.pid, kept.pid, flush=True)\n"
            "time.sleep(60)\n"
        ), str(tmp_path)],
        stdout=subprocess.PIPE, text=True,
    )
    assert owner.stdout is not None
    owned, kept = (int(pid) for pid in owner.stdout.readline().split())
    try:
        owner.kill()
        owner.wait(10)
        deadline = time.monotonic() + 10
        while pid_alive(owned) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_alive(owned), "the owned service outlived its owner"
        assert pid_alive(kept), "a detached service must outlive the command that started it"
    finally:
        for pid in (owned, kept):
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_detached_process_is_not_our_child_and_stops(tmp_path: Path) -> None:
    proc = spawn("sleeper", _SLEEP, tmp_path / "s.log", detached=True, stop_signal=signal.SIGTERM)
    assert proc.popen is None and pid_alive(proc.pid)
    assert os.getsid(proc.pid) != os.getsid(0)  # own session: a terminal's Ctrl-C misses it
    stop_pid(proc.pid, signal.SIGTERM, timeout_s=5)
    assert not pid_alive(proc.pid)


def test_stop_escalates_to_sigkill(tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    proc = spawn("stubborn", _IGNORE_TERM, log, detached=False, stop_signal=signal.SIGTERM)
    assert proc.popen is not None and proc.popen.poll() is None
    deadline = time.monotonic() + 10
    while "ready" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.01)  # until the handler is installed
    proc.stop(timeout_s=0.2)
    assert proc.popen.returncode == -signal.SIGKILL


def test_log_tail_strips_colours(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(f"\x1b[2mline {i}\x1b[0m\n" for i in range(30)))
    assert log_tail(log, 2) == "line 28\nline 29"
    assert "no log" in log_tail(tmp_path / "missing.log")
