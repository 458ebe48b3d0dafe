"""Child processes of the local services: spawn, pid files, liveness, reliable stop.

Two modes. *Owned*: a ``subprocess.Popen`` child that this Python process stops (tests, demo;
anything still running at interpreter exit is killed, and, started from the main thread, it ends
with the process if that is killed outright). *Detached*: started through ``/bin/sh``
in its own session so it outlives the caller and is never its zombie; it is found again via
a pid file (``streamrec up`` / ``down``).
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from streamrec.errors import ServiceError
from streamrec.orphans import end_with_parent

logger = logging.getLogger(__name__)

# Poll interval while waiting for a process to exit: short enough that stopping a service
# costs milliseconds, long enough not to spin.
_POLL_S = 0.02
# Shell that backgrounds the command with its output in the log file and prints its pid.
_DETACH = 'log=$1; shift; "$@" </dev/null >"$log" 2>&1 & echo $!'
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_OWNED: set[subprocess.Popen[bytes]] = set()
_atexit_registered = False


@dataclass
class ManagedProcess:
    """A started service process: its pid, log file and, when owned, its Popen handle."""

    name: str
    pid: int
    log_path: Path
    stop_signal: int = signal.SIGTERM
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def alive(self) -> bool:
        """Whether the process is still running."""
        if self.popen is not None:
            return self.popen.poll() is None
        return pid_alive(self.pid)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Send ``stop_signal``, wait up to ``timeout_s``, then SIGKILL; idempotent."""
        if self.popen is None:
            stop_pid(self.pid, self.stop_signal, timeout_s)
            return
        try:
            if self.popen.poll() is None:
                self.popen.send_signal(self.stop_signal)
                try:
                    self.popen.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    logger.warning("service=%s pid=%s ignored signal, killing", self.name, self.pid)
                    self.popen.kill()
                    self.popen.wait()
        finally:
            _OWNED.discard(self.popen)
        logger.info("service=%s pid=%s stopped", self.name, self.pid)


def spawn(
    name: str, cmd: Sequence[str], log_path: Path, *, detached: bool, stop_signal: int
) -> ManagedProcess:
    """Start ``cmd`` in a new session with stdout and stderr in ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "NO_COLOR": "1"}  # plain logs: the error messages quote their tail
    try:
        if detached:
            out = subprocess.run(
                ["/bin/sh", "-c", _DETACH, "sh", str(log_path), *cmd],
                capture_output=True,
                check=True,
                start_new_session=True,
                env=env,
                timeout=10,
            )
            return ManagedProcess(name, int(out.stdout), log_path, stop_signal)
        # Killed outright (kill -9, a crash), the owner could not stop it: it ends with the
        # owner. Linux sends that signal when the *thread* that started the child ends, so only
        # from the main thread, which ends with the process.
        ends = threading.current_thread() is threading.main_thread()
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                list(cmd),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
                preexec_fn=functools.partial(end_with_parent, os.getpid()) if ends else None,
            )
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        raise ServiceError(f"{name} could not be started ({cmd[0]}): {exc}") from exc
    global _atexit_registered
    if not _atexit_registered:  # registered on first use, not at import
        atexit.register(_kill_owned)
        _atexit_registered = True
    _OWNED.add(popen)
    return ManagedProcess(name, popen.pid, log_path, stop_signal, popen)


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a running (not zombie) process; reaps it if it is our dead child."""
    if pid <= 0:
        raise ValueError(f"not a single process id: {pid}")
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc (macOS): signal 0 succeeded, so it runs


def pid_cmdline(pid: int) -> str | None:
    """The process's command line, or None where /proc is unavailable."""
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return None


def pid_matches(pid: int, marker: str) -> bool:
    """Whether ``pid`` is alive and (where /proc can tell) runs a command containing ``marker``.

    Guards against a recycled pid: a stale pid file must never make us signal a stranger.
    """
    if not pid_alive(pid):
        return False
    cmdline = pid_cmdline(pid)
    return cmdline is None or marker in cmdline


def stop_pid(pid: int, sig: int = signal.SIGTERM, timeout_s: float = 5.0) -> None:
    """Signal ``pid``, wait up to ``timeout_s`` for it to exit, then SIGKILL it."""
    if pid <= 0:
        raise ValueError(f"not a single process id: {pid}")
    for current, wait_s in ((sig, timeout_s), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, current)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                return
            time.sleep(_POLL_S)
        logger.warning("pid=%s still running after signal=%s", pid, signal.Signals(current).name)
    raise ServiceError(f"process {pid} survived SIGKILL; check it with `ps -p {pid}`")


def read_pid(path: Path) -> int | None:
    """The pid in a pid file, or None when the file is missing or garbled."""
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid > 0 else None  # 0 and -N would signal whole process groups


def write_pid(path: Path, pid: int) -> None:
    """Write ``pid`` atomically, so a concurrent reader never sees a half-written file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{pid}\n")
    tmp.replace(path)


def log_tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file, without terminal colour codes."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(_ANSI.sub("", text).rstrip().splitlines()[-lines:])


def _kill_owned() -> None:
    """Kill owned children a caller forgot to stop, so none outlives the interpreter."""
    for popen in list(_OWNED):
        if popen.poll() is None:
            popen.kill()
            popen.wait()
