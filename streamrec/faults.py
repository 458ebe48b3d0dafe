"""Named fault points, for crash tests: ``STREAMREC_FAULT=<name>[:<nth>]`` fails the nth pass.

With ``STREAMREC_FAULT_MODE=exit`` the process dies on the spot (``os._exit(137)``, as a
kill -9 would leave it); with ``stop`` it freezes there (SIGSTOP, as kill -STOP or a VM
stall would leave it: every thread, heartbeats too) until someone sends it SIGCONT; otherwise
`InjectedFault` is raised. Unset, a fault point costs one dict lookup.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

ENV = "STREAMREC_FAULT"
_passes: Counter[str] = Counter()


class InjectedFault(RuntimeError):
    """Raised at a fault point named by ``STREAMREC_FAULT`` (tests only)."""


def fault_point(name: str) -> None:
    """Fail here if ``STREAMREC_FAULT`` names this point (on its nth pass, default the first)."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    target, _, nth = spec.partition(":")
    if target != name:
        return
    _passes[name] += 1
    if _passes[name] != int(nth or 1):
        return
    mode = os.environ.get(f"{ENV}_MODE")
    if mode == "exit":
        os._exit(137)
    if mode == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
        return  # continued: on from here, as the process would
    raise InjectedFault(f"injected fault at {name}")


def reset() -> None:
    """Forget pass counts (between tests)."""
    _passes.clear()
