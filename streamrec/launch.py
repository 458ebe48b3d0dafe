"""``python -m streamrec.launch``: ``python -m paddle.distributed.launch``, stop signals kept.

The same launcher with the same arguments (`streamrec.cli.ranks` starts it for
``learner run --workers N``; across hosts, run it on each host). Paddle's launcher imports
Paddle, which sets Paddle's own SIGTERM handler, before it sets its own handlers: a SIGTERM
in between (a ``learner run --workers N`` stopped as it starts) ended the launcher with
Paddle's "FatalError" trace, or deadlocked it (`streamrec.paddlesignals`). Here Paddle's
import keeps the handlers from before, so a launcher stopped that early ends quietly, before
it has started a rank.
"""

from __future__ import annotations

import runpy

from streamrec.paddlesignals import before_paddle


def main() -> None:
    """Run Paddle's launcher as ``python -m paddle.distributed.launch`` would, on this argv."""
    before_paddle()
    runpy.run_module("paddle.distributed.launch", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
