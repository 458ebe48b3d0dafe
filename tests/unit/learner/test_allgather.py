"""Arrays of any length all-gathered in one collective call (`streamrec.learner.allgather`), without gloo.

The collective is a stand-in: a thread per rank, which, as gloo's all-gather, hands every rank
every rank's array and requires them all of one length.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from streamrec.learner.allgather import SizedGather


class Collective:
    """``world`` ranks' all-gathers of equal-length int64 arrays, each rank on its own thread."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.sent: list[np.ndarray] = [np.zeros(0, np.int64)] * world
        self.calls = 0
        self._barrier = threading.Barrier(world)

    def rank(self, r: int) -> Callable[[np.ndarray], list[np.ndarray]]:
        def all_gather(array: np.ndarray) -> list[np.ndarray]:
            assert array.dtype == np.int64
            self.sent[r] = array.copy()
            self._barrier.wait()
            got = [a.copy() for a in self.sent]
            if r == 0:
                self.calls += 1
            self._barrier.wait()
            if len({len(a) for a in got}) != 1:  # gloo needs one length on every rank
                raise AssertionError(f"ranks sent {[len(a) for a in got]} items")
            return got

        return all_gather


def run(collective: Collective, gathers: Sequence[SizedGather], arrays: Sequence[np.ndarray]) -> list:
    """Every rank's gather of its array, each on its own thread; every rank's result."""
    out: list = [None] * len(gathers)

    def one(r: int) -> None:
        out[r] = gathers[r](arrays[r], "test")

    threads = [threading.Thread(target=one, args=(r,)) for r in range(len(gathers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return out


def ranks(world: int) -> tuple[Collective, list[SizedGather]]:
    collective = Collective(world)
    return collective, [SizedGather(collective.rank(r)) for r in range(world)]


def test_every_rank_gets_every_ranks_array_in_rank_order_an_empty_one_too() -> None:
    collective, gathers = ranks(3)
    arrays = [np.array([5, 6, 7]), np.zeros(0, np.int64), np.array([-1, 2**62])]
    for got in run(collective, gathers, arrays):
        assert [g.tolist() for g in got] == [[5, 6, 7], [], [-1, 2**62]]


def test_a_gather_within_the_agreed_capacity_is_one_collective_call() -> None:
    collective, gathers = ranks(2)
    run(collective, gathers, [np.arange(100), np.arange(80)])
    first = collective.calls
    for n in (100, 90, 30, 110, 0):  # within the capacity the first gather left: 100 and headroom
        before = collective.calls
        for got in run(collective, gathers, [np.arange(n), np.arange(n // 2) + 7]):
            assert [g.tolist() for g in got] == [list(range(n)), [k + 7 for k in range(n // 2)]]
        assert collective.calls - before == 1, n
    assert first == 2  # the first: the lengths, then the arrays


def test_a_gather_beyond_the_capacity_takes_a_second_call_and_every_rank_grows_it_alike() -> None:
    collective, gathers = ranks(2)
    run(collective, gathers, [np.arange(10), np.arange(10)])
    before = collective.calls
    got = run(collective, gathers, [np.arange(5), np.arange(1000)])  # only rank 1's outgrows it
    assert collective.calls - before == 2
    assert [g.tolist() for g in got[0]] == [list(range(5)), list(range(1000))]
    before = collective.calls
    run(collective, gathers, [np.arange(1000), np.arange(3)])
    assert collective.calls - before == 1  # both grew to the same capacity


def test_a_burst_does_not_pin_the_capacity() -> None:
    collective, gathers = ranks(2)
    run(collective, gathers, [np.arange(10_000), np.arange(10)])
    for _ in range(10):
        got = run(collective, gathers, [np.arange(10), np.arange(20)])
        assert [g.tolist() for g in got[1]] == [list(range(10)), list(range(20))]
    assert len(collective.sent[0]) < 100


def test_one_rank_gathers_without_a_collective() -> None:
    gather = SizedGather(lambda a: pytest.fail("no collective for one rank"), world=1)
    array = np.array([1, 2])
    assert gather(array, "test")[0].tolist() == [1, 2]


def test_a_gather_within_the_capacity_sends_from_one_buffer_and_nothing_stale_comes_back() -> None:
    sent: list[np.ndarray] = []

    def two_alike(array: np.ndarray) -> list[np.ndarray]:  # two ranks, both sending this array
        sent.append(array)
        return [array.copy(), array.copy()]

    gather = SizedGather(two_alike)
    gather(np.arange(10), "test")  # sets the capacity
    first = gather(np.arange(8), "test")
    second = gather(np.array([7, 7]), "test")
    assert sent[-1] is sent[-2]  # one buffer, not one allocated a gather
    assert [a.tolist() for a in first] == [list(range(8))] * 2  # not overwritten by the next
    assert [a.tolist() for a in second] == [[7, 7]] * 2
