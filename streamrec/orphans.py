"""A child process that ends with its parent, rather than run on orphaned.

``streamrec learner run --workers N`` starts a launcher, which starts the ranks, ``streamrec
serve --processes N`` server processes, and tests and the demo their own broker and Redis
(`streamrec.local.processes`, owned). Killed outright (kill -9, the OOM killer, a supervisor's last
resort), the command cannot stop them, and they ran on: ranks training beside the group a
restart starts, servers holding the port the restarted command must bind. Linux's
``PR_SET_PDEATHSIG`` has the kernel send such a child SIGTERM when its parent dies, which each
of them already takes as a request to stop cleanly.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

# prctl(2)'s option: the signal this process gets when its parent dies.
_PR_SET_PDEATHSIG = 1
# Found at import, in the parent: a child between fork and exec only calls it (`subprocess`'s
# ``preexec_fn`` runs there, where loading a library could deadlock on a lock another thread held).
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def end_with_parent(parent: int) -> None:
    """Have this process get SIGTERM when ``parent`` (its parent's pid) dies; Linux only.

    Call it in the child (a ``preexec_fn``, or early in its own code). If the parent already
    died before the request took effect, the child signals itself at once.
    """
    if _PRCTL is None:
        return
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)
