"""Paddle's import, kept from taking SIGINT's and SIGTERM's handlers (and the root logger).

Paddle sets C++ handlers process-wide when it is first imported (glog's failure handler, with
Paddle's writer): on SIGSEGV, SIGABRT and the other crash signals, and on SIGTERM. On SIGTERM
it does harm two ways. It ends the process at once with a "FatalError" trace, where a
command's own handler stops it cleanly. And it allocates, which a signal handler must not: a
SIGTERM that lands inside malloc deadlocks the process in the handler on malloc's lock (seen:
``streamrec serve`` and ``streamrec score`` stopped as they imported Paddle hung until SIGKILL;
once glibc aborted on a corrupted heap instead). So streamrec imports Paddle with SIGINT and
SIGTERM held back and puts back the handlers they had before letting them through. Paddle keeps
its handlers on the crash signals, whose traces help.

The handlers are set by ``paddle.base``'s import (its ``__bootstrap__``), so they are put back as
that import ends, well within a millisecond of Paddle setting its own, and again as ``paddle``'s
ends. Holding the signals back holds for the importing thread only: another thread running
then (a progress display's) could take a SIGTERM sent in that millisecond, and the window
grows while that thread runs Python (the importing thread waits its turn for the GIL; the
likely reason a backtest's display thread took the signal in every try). So each command
imports Paddle before it starts a thread. Paddle sets the handler at import only: it is not
set again by training, scoring, or importing ``paddle.inference`` or ``paddle.distributed``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import signal
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from types import ModuleType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: Paddle's package, and its package whose import sets Paddle's handlers.
_KEPT_IMPORTS = frozenset({"paddle", "paddle.base"})
_CCACHE = "No ccache found"  # Paddle's import-time warning (it only builds C++ extensions)


@contextmanager
def stop_signals_kept() -> Iterator[None]:
    """Through the block, SIGINT and SIGTERM held back and their handlers kept; then let through.

    A signal sent meanwhile reaches the handler from before the block once it ends. Held back
    in this thread only: a process-directed signal may go to another thread that does not hold
    it back, so call this where the process has no other thread, or none that matters.
    """
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        for sig, handler in before.items():
            if handler is not None:  # None: not set from Python, nothing to put back
                signal.signal(sig, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


@contextmanager
def root_logging_kept() -> Iterator[None]:
    """Through the block, the root logger's handlers, level and propagation put back as they were.

    Paddle's import gives the root logger an INFO ``StreamHandler`` (``paddle.distributed``'s
    ``get_logger(name="root")``): a program importing streamrec would print every library's INFO
    records on stderr. A library leaves logging to the program (the CLI configures it).
    """
    root = logging.getLogger()
    handlers, level, propagate = list(root.handlers), root.level, root.propagate
    try:
        yield
    finally:
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
        root.setLevel(level)
        root.propagate = propagate


@contextmanager
def ccache_warning_hidden() -> Iterator[None]:
    """Through the block, Paddle's warning that ccache is missing ignored; the filter gone after.

    Only this filter is taken out again: those the import adds (numpy's, pkg_resources') stay.
    """
    warnings.filterwarnings("ignore", message=_CCACHE)
    ours = warnings.filters[0]
    try:
        yield
    finally:
        filters = warnings.filters  # a list, typed a Sequence
        with suppress(ValueError):  # the program reset the filters meanwhile
            if isinstance(filters, list):
                filters.remove(ours)


class _PaddleImport(importlib.abc.MetaPathFinder):
    """Finds ``paddle`` and ``paddle.base`` as the path finder does; runs their imports held back.

    Each one's import runs in `stop_signals_kept`, `root_logging_kept` and `ccache_warning_hidden`.
    """

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _KEPT_IMPORTS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run_module = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            with stop_signals_kept(), root_logging_kept(), ccache_warning_hidden():
                run_module(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]  # this spec's loader alone
        return spec


def guard_paddle_import() -> None:
    """Have Paddle's first import in this process leave SIGINT's and SIGTERM's handlers, and logging, be.

    Wherever the import comes from, it runs in `stop_signals_kept`, `root_logging_kept` and
    `ccache_warning_hidden`. Once Paddle is imported, this does nothing. The packages whose
    modules import Paddle (`streamrec.learner`, `streamrec.serving`) call it as they are
    imported, for programs that use streamrec as a library; each command calls it first
    (`before_paddle`).
    """
    if "paddle" in sys.modules or any(isinstance(f, _PaddleImport) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _PaddleImport())


def before_paddle() -> None:
    """What each process streamrec starts does before Paddle's first import.

    The stop handlers kept (`guard_paddle_import`), and Paddle's import-time warning
    that ccache is missing silenced (`quiet_paddle_import`).
    """
    quiet_paddle_import()
    guard_paddle_import()


def quiet_paddle_import() -> None:
    """Silence Paddle's import-time warning that ccache is missing (it only builds C++ extensions)."""
    warnings.filterwarnings("ignore", message=_CCACHE)
