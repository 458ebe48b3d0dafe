"""A rank that joins a group, trains a layer a few steps, and leaves it: ``python tests/leaving_rank.py
OUT_PREFIX [fail]`` under ``python -m streamrec.launch``.

As the interpreter starts its exit (an ``atexit`` handler registered after Paddle's, so run before
them) it writes to ``OUT_PREFIX.<rank>.json`` what is still there: how many of the threads that
joining the group started (gloo's, the TCP store's, the watch), and whether Paddle's process group
is. With ``fail`` the block raises after training, and the rank leaves without meeting.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from pathlib import Path

from streamrec.paddlesignals import before_paddle


def threads() -> set[int]:
    return {int(tid) for tid in os.listdir("/proc/self/task")}


def main(out_prefix: str, fail: str = "") -> None:
    before_paddle()
    import numpy as np
    import paddle
    import paddle.distributed as dist

    from streamrec.learner.ranks import RankGroup, launched_world

    rank, world = launched_world()
    out = Path(f"{out_prefix}.{rank}.json")
    layer = paddle.nn.Linear(8, 2)
    optimizer = paddle.optimizer.Adam(parameters=layer.parameters())
    alone = threads()
    group = RankGroup(rank, world, 30.0)
    started = threads() - alone

    def at_exit() -> None:
        left = {"started": len(started), "running": len(started & threads())}
        out.write_text(json.dumps({**left, "initialized": dist.is_initialized()}))

    atexit.register(at_exit)
    try:
        with group:
            summed = group.share.join(layer)
            for step in range(5):
                group.gather(np.arange(3 + rank, dtype=np.int64), "restore" if step == 0 else "step")
                layer(paddle.randn([4, 8])).mean().backward()
                if summed is not None:
                    summed()
                optimizer.step()
                optimizer.clear_grad()
            if fail:
                raise RuntimeError("failed on purpose")
    except RuntimeError as exc:
        print(f"rank {rank}: {exc}", flush=True)
        sys.exit(3)
    print(f"rank {rank} left", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
