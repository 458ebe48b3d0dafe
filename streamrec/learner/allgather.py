"""Arrays of any length all-gathered across the ranks in one collective call.

Gloo's all-gather takes arrays of one length on every rank, and on gloo a collective costs a
rank a fixed 0.3 ms of CPU or more however small it is (about a millisecond with gloo's loop
thread left to preempt the caller: `streamrec.learner.ranks.batch_scheduled`). Agreeing on the
lengths first (an all-reduce) made every exchange two calls, and the ranks exchange their
gradients in every step. `SizedGather` agrees on a capacity instead: every rank sends its
length and its array padded to the capacity in one all-gather; only when some rank's array
outgrew it do the ranks, all seeing the same lengths, send the arrays again at the longest
length, and every rank sets the same new capacity. Each kind of exchange (``what``) keeps its
own capacity, as their sizes differ by orders of magnitude (a step's gradients, a
micro-batch's places).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

#: An all-gather of int64 1-D arrays of one length on every rank: every rank's, in rank order,
#: as arrays of its own (the array it is given is reused for the next gather).
AllGather = Callable[[np.ndarray], list[np.ndarray]]


def headroom(longest: int) -> int:
    """The capacity after a gather whose longest array held ``longest`` items.

    A quarter more: a step's gradients vary by the rows its mini-batch touched, a few per cent
    of their size, so one round stays enough; gloo's cost hardly grows with the bytes.
    """
    return longest + longest // 4


class SizedGather:
    """Every rank's int64 1-D array (lengths may differ), in rank order, in one call mostly."""

    def __init__(self, all_gather: AllGather, world: int | None = None) -> None:
        """Gather through ``all_gather``; ``world`` 1 gathers without it."""
        self._all_gather = all_gather
        self._alone = world == 1
        self._capacity: dict[str, int] = {}
        self._sent: dict[str, np.ndarray] = {}  # per ``what``: its send buffer, 1 + capacity

    def __call__(self, array: np.ndarray, what: str) -> list[np.ndarray]:
        """Every rank's ``array``; every rank must call it, with the same ``what``, in the same order."""
        array = np.ascontiguousarray(array, dtype=np.int64).ravel()
        if self._alone:
            return [array]
        capacity = self._capacity.get(what, 0)
        sent = self._sent.get(what)
        if sent is None or len(sent) != 1 + capacity:
            sent = self._sent[what] = np.zeros(1 + capacity, np.int64)
        sent[0] = len(array)  # past it, the buffer's items are a former gather's: never read
        sent[1 : 1 + min(len(array), capacity)] = array[:capacity]
        first = self._all_gather(sent)
        sizes = [int(g[0]) for g in first]
        longest = max(sizes)
        if longest <= capacity:
            parts = [g[1 : 1 + n] for g, n in zip(first, sizes, strict=True)]
        else:  # some rank's array outgrew the capacity: every rank sees it, and sends again
            padded = np.zeros(longest, np.int64)
            padded[: len(array)] = array
            parts = [g[:n] for g, n in zip(self._all_gather(padded), sizes, strict=True)]
        if longest > capacity:
            self._capacity[what] = headroom(longest)
        elif headroom(longest) < capacity // 4:  # after a burst: halve, a gather at a time
            self._capacity[what] = capacity // 2
        return parts
