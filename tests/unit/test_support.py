"""The test helpers that pick processes from outside, by what they hold (tests/support.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.support import paddle_handlers_set

#: Imports Paddle, forks a copy of itself that never execs, prints both pids, waits for stdin.
_PADDLE_AND_A_FORKED_COPY = textwrap.dedent("""
    import os, sys, time
    import paddle
    child = os.fork()
    if child == 0:
        time.sleep(120)
        os._exit(0)
    print(os.getpid(), child, flush=True)
    sys.stdin.read()
    os.kill(child, 9)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_child_forked_but_not_yet_execd_is_not_taken_for_a_process_that_imported_paddle() -> None:
    """Between fork and exec a child is a copy of its parent, Paddle's handlers and library
    with it: a server process or a resource tracker being started by a command that has Paddle
    loaded. Taken for one that had loaded Paddle, it was sent the signal meant for a server
    process; multiprocessing's resource tracker, which blocks SIGTERM from its fork on and then
    ignores it, lived on until the command ended, and the test waiting for it failed.
    """
    with subprocess.Popen(
        [sys.executable, "-c", _PADDLE_AND_A_FORKED_COPY],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as proc:  # its pipes closed, it waited for, at the end
        assert proc.stdout is not None and proc.stdin is not None
        parent, copy = (int(pid) for pid in proc.stdout.readline().split())
        assert paddle_handlers_set(parent)
        assert os.path.exists(f"/proc/{copy}") and not paddle_handlers_set(copy)
