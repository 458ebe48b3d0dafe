"""Garbage-collector settings for streamrec's batch loops.

The consumers, the learner, the replay and the demo commands keep thousands of objects alive
at a time. Not for
``streamrec serve``: its requests keep few objects alive, and its latency is what counts.

CPython collects its youngest generation whenever tracked objects allocated exceed those freed
by 700 (the default). A consumer batch keeps some 10^4 objects alive (records, events,
arrivals, samples) until it is committed, so the collector ran over and over while each batch
was built, promoting what it found to older generations and setting off full collections of
the whole heap: on the Taobao slice 1,400 collections and 0.8 s of 6 s of batch time. A young
threshold above a batch's live objects leaves that to reference counting, which frees almost
all of it; cycles are still collected, only later. What is alive when the loop starts
(imported modules, the configuration, a loaded model) is frozen out of every collection.
"""

from __future__ import annotations

import gc

#: Net allocations of tracked objects before a young collection: above what a batch of
#: several thousand events keeps alive.
YOUNG_THRESHOLD = 100_000


def tune_for_batches(young: int = YOUNG_THRESHOLD) -> None:
    """Tune the garbage collector for a long-running batch loop.

    Collect young objects every ``young`` net allocations instead of 700, and keep what
    is alive now out of every later collection (once per process, when its loop starts).
    """
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, old)
