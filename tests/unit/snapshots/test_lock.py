"""SnapshotLock: one learner per snapshot directory, named when it refuses, never stale."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from streamrec.errors import SnapshotInUse
from streamrec.snapshots.lock import SnapshotLock

# Takes the lock, says so, then holds it until killed (stdin never closes before that).
_HOLDER = """
import sys
from pathlib import Path
from streamrec.snapshots.lock import SnapshotLock
SnapshotLock(Path(sys.argv[1])).acquire()
print("locked", flush=True)
sys.stdin.read()
"""


def test_a_second_lock_in_the_same_process_is_refused_naming_the_holder(tmp_path: Path) -> None:
    first = SnapshotLock(tmp_path).acquire()
    message = (
        f"snapshot directory {tmp_path} is in use by pid {os.getpid()} on host "
        f"{socket.gethostname()} since "
    )
    with pytest.raises(SnapshotInUse, match="is another `streamrec learner run` running") as err:
        SnapshotLock(tmp_path).acquire()
    assert str(err.value).startswith(message)
    first.release()
    assert not first.held
    with SnapshotLock(tmp_path) as again:
        assert again.held and again.holder()["pid"] == os.getpid()
    assert again.holder() == {}  # a released lock names nobody
    assert stat.S_IMODE((tmp_path / ".lock").stat().st_mode) == 0o644


def test_a_lock_held_by_a_killed_process_is_free_again(tmp_path: Path) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
            with pytest.raises(SnapshotInUse, match=f"in use by pid {holder.pid} on host "):
                SnapshotLock(tmp_path).acquire()
        finally:
            holder.send_signal(signal.SIGKILL)  # as kill -9: no cleanup runs in the holder
            holder.wait()
    assert holder.returncode == -signal.SIGKILL
    lock = SnapshotLock(tmp_path).acquire()  # the kernel released it: no stale lock
    assert lock.holder()["pid"] == os.getpid()
    lock.release()
