"""`streamrec.orphans`: a child ends with its parent (Linux's PR_SET_PDEATHSIG)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil  # type: ignore[import-untyped]
import pytest

from tests.support import running, wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

# A parent that starts a child asking to end with it, prints the child's pid and sleeps.
PARENT = """
import functools, os, subprocess, sys, time
from streamrec.orphans import end_with_parent
child = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(120)"],
    preexec_fn=functools.partial(end_with_parent, os.getpid()),
)
print(child.pid, flush=True)
time.sleep(120)
"""


def test_a_child_gets_sigterm_when_its_parent_is_killed() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = psutil.Process(int(parent.stdout.readline()))
    try:
        time.sleep(0.2)
        assert child.is_running()
        parent.kill()
        parent.wait(10)
        wait_for(lambda: not running([child]), 10, "the child gone")
    finally:
        if child.is_running():
            child.kill()


def test_a_child_whose_parent_died_before_it_asked_ends_at_once() -> None:
    """The request names a parent that is not this child's: as if it died before the call."""
    code = "from streamrec.orphans import end_with_parent; end_with_parent(1); import time; time.sleep(30)"
    done = subprocess.run([sys.executable, "-c", code], timeout=20, check=False)
    assert done.returncode == -signal.SIGTERM
