"""``python -m streamrec.launch``: ``python -m paddle.distributed.launch``, stop signals kept.

The same launcher with the same arguments (`streamrec.cli.ranks` starts it for
``learner run --workers N``; across hosts, run it on each host). Paddle's launcher imports
Paddle, which sets Paddle's own SIGTERM handler, before it sets its own handlers: a SIGTERM
in between (a ``learner run --workers N`` stopped as it starts) ended the launcher with
Paddle's "FatalError" trace (the same handler deadlocked other commands:
`streamrec.paddlesignals`). Here Paddle's import keeps the handlers from before, so a
launcher stopped that early ends quietly, before it has started a rank.
"""

from __future__ import annotations

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
    and errors).
    """
    if not any(a == "--log_level" or a.startswith("--log_level=") for a in argv):
        argv[1:1] = ["--log_level", "WARNING"]
    env.setdefault("GLOG_minloglevel", "1")


def main() -> None:
    """Run Paddle's launcher as ``python -m paddle.distributed.launch`` would, on this argv.

    A SIGINT before the launcher sets its own handler (Ctrl-C as it starts) ends it by the
    signal, as a process without a handler ends, and not with a KeyboardInterrupt traceback:
    it has started no rank yet. Once set, the launcher's handler stops the ranks and exits.
    """
    before_paddle()
    quiet_defaults(sys.argv, os.environ)
    try:
        runpy.run_module("paddle.distributed.launch", run_name="__main__", alter_sys=True)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)


if __name__ == "__main__":
    main()
