"""``python -m streamrec.launch``: ``python -m paddle.distributed.launch``, stop signals kept.

The same launcher with the same arguments (`streamrec.cli.ranks` starts it for
``learner run --workers N``; across hosts, run it on each host). Paddle's launcher imports
Paddle, which sets Paddle's own SIGTERM handler, before it sets its own handlers: a SIGTERM
in between (a ``learner run --workers N`` stopped as it starts) ended the launcher with
Paddle's "FatalError" trace (the same handler deadlocked other commands:
`streamrec.paddlesignals`). Here Paddle's import keeps the handlers from before, so a
launcher stopped that early ends quietly, before it has started a rank.

It also signals each rank once per stop: Paddle's launcher sent a rank SIGTERM up to three
times, 0.2 s apart, for one stop (`signal_each_rank_once`).
"""

from __future__ import annotations

import logging
import os
import runpy
import signal
import sys
from collections.abc import MutableMapping

from streamrec.paddlesignals import before_paddle


def quiet_defaults(argv: list[str], env: MutableMapping[str, str]) -> None:
    """Paddle's chatter at a group's start left out, unless the command line or environment asks.

    The launcher logs its whole configuration at every start (35 lines; ``--log_level
    WARNING`` keeps its errors: a failed rank is named, with the end of its log), and Paddle's
    C++ logs at INFO level as each rank joins (glog's ``GLOG_minloglevel`` 1 keeps its warnings
    and errors). Across hosts (``--master``) the launcher talks to its master over HTTP, and
    the HTTP client (httpx) logged each request at INFO: two lines every half second while a
    launcher waits for the other hosts; its warnings are kept.
    """
    if not any(a == "--log_level" or a.startswith("--log_level=") for a in argv):
        argv[1:1] = ["--log_level", "WARNING"]
        logging.getLogger("httpx").setLevel(logging.WARNING)
    env.setdefault("GLOG_minloglevel", "1")


def signal_each_rank_once() -> None:
    """Make Paddle's launcher send a rank one SIGTERM for each stop, not up to three.

    To stop its ranks (the launcher signalled, a rank failed) Paddle's ``ProcessContext.terminate``
    sent each SIGTERM, waited 0.2 s, and sent it again while the rank lived, three times. A
    streamrec rank takes a second signal for "stop at once" (`streamrec.cli.common.stop_on_signals`):
    so one ``kill`` of ``learner run --workers N`` (or of the launcher) dropped the micro-batch in
    hand, the rank exited 130, and the others' next collective failed with a traceback. Once
    each, a rank finishes its micro-batch as one learner does; a second stop (a second signal to
    the launcher) sends the second SIGTERM, and the launcher still kills what outlives its wait.
    """
    try:
        from paddle.distributed.launch.utils.process_context import ProcessContext

        terminate = ProcessContext.terminate
    except (ImportError, AttributeError):  # a Paddle whose launcher is laid out otherwise
        logging.getLogger(__name__).warning(
            "this Paddle's launcher has no ProcessContext.terminate: a rank may take one stop "
            "for two and drop the micro-batch in hand"
        )
        return
    if getattr(terminate, "streamrec_once", False):
        return

    def once(self: ProcessContext, force: bool = False, max_retry: int = 1) -> bool:
        return bool(terminate(self, force=force, max_retry=1))

    once.streamrec_once = True  # type: ignore[attr-defined]
    ProcessContext.terminate = once  # type: ignore[method-assign]


def main() -> None:
    """Run Paddle's launcher as ``python -m paddle.distributed.launch`` would, on this argv.

    A SIGINT before the launcher sets its own handler (Ctrl-C as it starts) ends it by the
    signal, as a process without a handler ends, and not with a KeyboardInterrupt traceback:
    it has started no rank yet. Once set, the launcher's handler stops the ranks and exits.
    """
    before_paddle()
    quiet_defaults(sys.argv, os.environ)
    try:
        signal_each_rank_once()  # imports Paddle: a Ctrl-C meanwhile ends it as below
        runpy.run_module("paddle.distributed.launch", run_name="__main__", alter_sys=True)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)


if __name__ == "__main__":
    main()
