"""Data-parallel learner ranks on Paddle's collective engine (gloo on CPU, NCCL on GPU).

A group of ``world`` learner processes, started by ``python -m paddle.distributed.launch``
(``streamrec learner run --workers N`` starts it for one host), joins with
``paddle.distributed.init_parallel_env`` and talks only through its collectives: no
transport of our own.

`RankShare` is what a learner needs: its rank and the group's size, the exchange of what
every rank must decide alike (the micro-batch's ids for admission, its counts for the id
statistics: small arrays, one collective each), and the averaging of the ranks' gradients
after each backward pass (`streamrec.learner.gradients`: dense ones summed, an embedding's
sparse row gradients concatenated, so each rank applies every rank's rows; one all-gather a
step).
`GroupLayout` says where a rank's own samples sit in the group's micro-batch, and so which of
each mini-batch it trains. `RankGroup` is what the loop needs: it all-gathers each rank's
samples' places and positions, so every rank knows the group's order and rank 0 snapshots
every rank's positions. No rank decodes or encodes another's samples.

Every collective is bounded: a rank that waits longer than ``timeout_s`` for the others
(one of them killed, frozen, or cut off) logs why and leaves the process with exit status
`LOST_RANK`; gloo itself fails at once when a peer's connection closes, and a collective that
one rank waits in for 30 s fails at gloo's own timeout, whatever ``timeout_s`` says. So before
the exchanges where a rank may wait on another's work outside the collectives (`MEET`: the
restore at start, each part's exchange, which rank 0 reaches only once it has written,
exported and gated a snapshot) the ranks first meet on Paddle's TCP store, where the wait is
bounded by ``timeout_s`` alone. A failed collective is `streamrec.errors.RankLost`: one line.

A rank leaves the group as its run ends (`RankGroup.close`, as its ``with`` block ends), not in
the interpreter's exit: there the gloo group was destroyed in the last garbage collection of
Paddle's module globals, its threads still running while the modules were torn down.
"""

from __future__ import annotations

import io
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, redirect_stderr
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np
import paddle

from streamrec.errors import RankLost
from streamrec.learner.allgather import SizedGather
from streamrec.learner.columns import EncodedColumns
from streamrec.learner.gradients import Gather, GradientSum

logger = logging.getLogger(__name__)

# The exit status of a rank that gave up waiting for the others.
LOST_RANK = 75

#: The exchanges the ranks meet before (`RankGroup.meet`): where one may wait on another's work
#: outside the collectives longer than gloo's own 30 s (a snapshot's export, a slow restore).
MEET = frozenset({"restore", "exchange"})
#: The TCP store's counter of the ranks' meetings.
MET_KEY = "streamrec/ranks/met"
#: The TCP store's counter of the ranks other than 0 done with the store, as they leave.
LEFT_KEY = "streamrec/ranks/left"
#: What a rank that leaves with an error takes from the counter: far more than the meetings
#: ever add, so a rank waiting at a meeting reads a negative count and leaves too.
LEFT = 1 << 60


def launched_world() -> tuple[int, int]:
    """(rank, world) from ``paddle.distributed.launch``'s environment; (0, 1) outside it."""
    world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    rank = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
    return rank, world


@dataclass(frozen=True)
class RankShare:
    """One rank's part in data-parallel training.

    ``gather`` is the group's (`RankGroup.gather`); a learner exchanges through it what every
    rank must decide alike (`exchange`).
    """

    rank: int
    world: int
    gather: Gather | None = field(default=None, compare=False, repr=False)

    def join(self, module: paddle.nn.Layer) -> GradientSum | None:
        """What averages ``module``'s gradients across the ranks after a backward pass.

        Rank 0's weights are broadcast to every rank first (as ``paddle.DataParallel`` does),
        so the ranks start alike. None for one rank.
        """
        if self.world == 1 or self.gather is None:
            return None
        from paddle.distributed.parallel import sync_params_buffers

        sync_params_buffers(module)
        return GradientSum(module, self.gather)

    def exchange(self, arrays: Mapping[str, np.ndarray], what: str) -> dict[str, np.ndarray]:
        """Every rank's 1-D ``arrays`` (8-byte items), name by name, concatenated in rank order.

        One collective however many arrays; every rank must pass the same names and dtypes.
        """
        if self.world == 1 or self.gather is None:
            return dict(arrays)
        gathered = [unpack(g, arrays) for g in self.gather(pack(arrays), what)]
        return {k: np.concatenate([g[k] for g in gathered]) for k in arrays}


def pack(arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    """``arrays`` (1-D, 8-byte items) as one int64 array: their lengths, then their items.

    Raises:
        ValueError: an array's items are not 8 bytes (a view would misread them).
    """
    narrow = [name for name, a in arrays.items() if a.dtype.itemsize != 8]
    if narrow:
        raise ValueError(f"exchanged arrays need 8-byte items: {', '.join(narrow)}")
    parts = [np.ascontiguousarray(a).view(np.int64) for a in arrays.values()]
    return np.concatenate([np.array([len(p) for p in parts], np.int64), *parts])


def unpack(packed: np.ndarray, like: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What `pack` made of arrays with ``like``'s names and dtypes."""
    ends = np.cumsum(packed[: len(like)]) + len(like)
    return {
        name: packed[end - n : end].view(array.dtype)
        for (name, array), n, end in zip(like.items(), packed[: len(like)], ends, strict=True)
    }


@dataclass(frozen=True, eq=False)
class GroupLayout:
    """Where one rank's samples sit in the group's micro-batch, ordered by (partition, offset).

    Every rank shuffles the group's ``total`` positions alike and cuts them into mini-batches;
    each trains, of each mini-batch, the samples it holds (`share`).

    Attributes:
        total: Samples in the group's micro-batch.
        mine: int64 [n]: the group position of each of this rank's samples, in its batch's order.
    """

    total: int
    mine: np.ndarray

    @classmethod
    def alone(cls, n: int) -> GroupLayout:
        """One process holding the whole micro-batch of ``n``."""
        return cls(n, np.arange(n, dtype=np.int64))

    @classmethod
    def of(cls, places: Sequence[np.ndarray], rank: int) -> GroupLayout:
        """``rank``'s layout, ``places[r]`` being rank r's samples' (partition, offset) rows."""
        rows = np.concatenate([np.asarray(p, np.int64).reshape(-1, 2) for p in places])
        position = np.empty(len(rows), np.int64)
        position[np.lexsort((rows[:, 1], rows[:, 0]))] = np.arange(len(rows))
        start = sum(len(p) for p in places[:rank])
        return cls(len(rows), position[start : start + len(places[rank])])

    @cached_property
    def _local(self) -> np.ndarray:
        """Per group position: this rank's index of its sample, -1 for another rank's."""
        local = np.full(self.total, -1, np.int64)
        local[self.mine] = np.arange(len(self.mine))
        return local

    def share(self, minibatch: np.ndarray, world: int) -> tuple[np.ndarray, float]:
        """This rank's samples (its indices) of a mini-batch of group positions, and their loss scale.

        The ranks' gradients are averaged (`GradientSum`), so a share of ``n`` of the
        mini-batch's ``total`` samples scales its mean loss by ``world * n / total``: the
        average is then the gradient of the mean loss over the whole mini-batch. A rank with
        no sample of it still steps (the gradients' exchange needs every rank), on padding, scale 0.
        """
        local = self._local[minibatch]
        own = local[local >= 0]
        return own, world * len(own) / len(minibatch)


def padding_only(part: EncodedColumns) -> EncodedColumns:
    """``part`` with every id on the padding row (0) and every number 0."""

    def zero(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: np.zeros_like(v) for k, v in arrays.items()}

    return replace(
        part,
        targets=zero(part.targets),
        sequences=zero(part.sequences),
        context=zero(part.context),
        label=np.zeros_like(part.label),
        dense=np.zeros_like(part.dense),
        extras=zero(part.extras),
    )


TASKS = "/proc/self/task"


def _threads() -> set[int]:
    """The process's threads' ids (Linux's; empty elsewhere)."""
    try:
        return {int(tid) for tid in os.listdir(TASKS)}
    except OSError:
        return set()


def batch_scheduled(threads: Iterable[int]) -> int:
    """Put ``threads`` under Linux's ``SCHED_BATCH`` policy; how many it could.

    gloo's TCP transport answers the network in a loop thread of its own, which only tries the
    lock of a connection that the calling thread holds while it writes, and otherwise goes
    straight back to a socket that is still readable (gloo's ``Pair::handleEvents``). On a rank
    held to one core, that thread woke, preempted the caller, then spun on the readable socket
    until the scheduler let the caller finish its write: an all-gather of 340 KB cost 1.3-1.6 ms
    of CPU and 1.8-2.0 ms by the clock, one of 8 bytes nearly as much. Under ``SCHED_BATCH``
    (sched(7): the same share of the CPU, but its wake-ups do not preempt) the caller finishes
    first: 0.3 ms, and 0.3-0.4 ms by the clock (bench/HISTORY.md). Ranks not held to a core
    measured the same either way.
    """
    done = 0
    for tid in threads:
        try:
            os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
        except (OSError, AttributeError):  # a thread gone, a policy refused, or not Linux
            continue
        done += 1
    return done


class RankGroup:
    """The collectives the learner loop runs, each bounded by ``timeout_s``."""

    def __init__(self, rank: int, world: int, timeout_s: float) -> None:
        """Join the group (``init_parallel_env``) when ``world`` > 1."""
        self.rank, self.world, self.timeout_s = rank, world, timeout_s
        self._deadline: float | None = None
        self._what = ""
        self._lock = threading.Lock()
        self._sized = SizedGather(self._all_gather, world)
        self._store: Any = None
        self._met = 0  # meetings so far: alike on every rank
        self._stopped = threading.Event()
        self._watcher: threading.Thread | None = None
        if world > 1:
            import paddle.distributed as dist

            before = _threads()
            said = io.StringIO()
            try:
                with redirect_stderr(said):  # its table of Paddle's flags changed
                    dist.init_parallel_env()
            finally:
                for line in said.getvalue().splitlines():
                    logger.debug("paddle.distributed: %s", line)
            if paddle.device.get_device() == "cpu":
                started = _threads() - before  # gloo's threads (and rank 0's store's)
                logger.debug("rank %d: %d of %d new threads under SCHED_BATCH", rank,
                             batch_scheduled(started), len(started))
            if dist.get_rank() != rank or dist.get_world_size() != world:
                raise RuntimeError("paddle.distributed disagrees with the launcher's rank and size")
            from paddle.base import core

            self._store = core.create_or_get_global_tcp_store()  # the one the group joined by
            self._watcher = threading.Thread(target=self._watch, name="streamrec-rank-watch", daemon=True)
            self._watcher.start()

    def __enter__(self) -> RankGroup:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self.close(parting=kind is None)

    def close(self, parting: bool = True) -> None:
        """Leave the group, in this order, before the interpreter's exit; once.

        With ``parting`` (the run ended well) the ranks meet once more, so every rank is past
        its last collective, and rank 0, whose process serves the TCP store, waits until the
        others are done with it (`LEFT_KEY`). Then the watch thread stops and the process group
        is destroyed (`leave_process_group`): gloo's threads joined while the interpreter is
        whole. Left to the interpreter's exit, the group went in its last garbage collection,
        among Paddle's module globals, with the watch thread still waking.

        Raises:
            RankLost: another rank failed at the last meeting.
        """
        if self._stopped.is_set():
            return
        try:
            if parting and self._store is not None:
                with self.bounded("leave"), _lost(self, "leave"):
                    self.meet()
                    self._part()
        finally:
            self._stopped.set()
            if self._watcher is not None:
                self._watcher.join()
            if self.world > 1:
                leave_process_group()
            self._store = None

    def _part(self) -> None:
        """Rank 0 waits until the others are done with its TCP store; they say so, and are."""
        with _peers():
            if self.rank > 0:
                self._store.add(LEFT_KEY, 1)
                return
            pause = 0.0001
            while 0 <= self._store.add(LEFT_KEY, 0) < self.world - 1:
                time.sleep(pause)
                pause = min(2 * pause, 0.005)

    @property
    def share(self) -> RankShare:
        """This rank's part in training."""
        return RankShare(self.rank, self.world, self.gather)

    @contextmanager
    def bounded(self, what: str) -> Iterator[None]:
        """Leave the process (`LOST_RANK`) if the block, waiting on the others, overruns.

        Nested blocks (on any thread) run under the outermost one's deadline.
        """
        with self._lock:
            outer = self._deadline is None
            if outer:
                self._deadline, self._what = time.monotonic() + self.timeout_s, what
        try:
            yield
        finally:
            if outer:
                with self._lock:
                    self._deadline = None

    def _watch(self) -> None:
        while not self._stopped.wait(min(1.0, self.timeout_s / 4)):
            with self._lock:
                late = self._deadline is not None and time.monotonic() > self._deadline
            if late:
                logger.error(
                    "rank %d of %d: no answer from the other ranks within %.0fs (%s); leaving so "
                    "the group can be restarted from the last snapshot",
                    self.rank,
                    self.world,
                    self.timeout_s,
                    self._what,
                )
                logging.shutdown()
                os._exit(LOST_RANK)

    def gather(self, array: np.ndarray, what: str) -> list[np.ndarray]:
        """Every rank's int64 1-D ``array`` (lengths may differ), in rank order.

        One all-gather at the capacity the ranks agreed for ``what`` (`SizedGather`); two when
        some rank's array outgrew it.
        """
        with self.bounded(what), _lost(self, what):
            if what in MEET:
                self.meet()
            return self._sized(array, what)

    def meet(self) -> None:
        """Wait until every rank has come here (the n-th call of each), on the TCP store.

        A counter every rank adds 1 to; a rank waits until it reaches ``n × world``. No
        collective is entered meanwhile, so the wait is bounded by `bounded`'s ``timeout_s``,
        not gloo's 30 s. The wait polls, from 0.1 ms to every 5 ms: a few round trips to rank
        0's store when the ranks come together, as they do on a backlog.
        """
        if self._store is None:
            return
        self._met += 1
        due, pause = self._met * self.world, 0.0001
        with _peers():
            count = self._store.add(MET_KEY, 1)
            while 0 <= count < due:
                time.sleep(pause)
                pause = min(2 * pause, 0.005)
                count = self._store.add(MET_KEY, 0)
        if count < 0:
            raise _PeerFailed("another rank left the group with an error, which its log names")

    @contextmanager
    def leaving_on_error(self) -> Iterator[None]:
        """Tell the others, on the TCP store, when the block fails, so none waits at a meeting.

        A rank refused as it starts (a setting, a snapshot of other settings) or failing later
        outside the collectives would leave the others waiting at their next meeting for
        ``timeout_s``: on its own host the launcher stops them, but not on the others' hosts.
        """
        try:
            yield
        except Exception:
            if self._store is not None:
                try:
                    self._store.add(MET_KEY, -LEFT)
                except (RuntimeError, ValueError, OSError):  # the store gone (rank 0 died): they see that
                    pass
            raise

    def _all_gather(self, array: np.ndarray) -> list[np.ndarray]:
        """Every rank's ``array``, all of one length."""
        import paddle.distributed as dist

        # Into one tensor, from and to arrays sharing its memory (DLPack): no list of tensors,
        # no copies; ~0.3 ms less CPU a call on gloo than a list (bench/HISTORY.md).
        gathered = paddle.empty([self.world * len(array)], "int64")
        with _peers():
            dist.stream.all_gather(gathered, paddle.from_dlpack(array))
        return list(np.from_dlpack(gathered).reshape(self.world, len(array)))


class _PeerFailed(Exception):
    """A collective or the TCP store failed: the first line of Paddle's error."""


@contextmanager
def _lost(group: RankGroup, what: str) -> Iterator[None]:
    """`_PeerFailed` in the block as `RankLost`, naming the exchange ``what``."""
    try:
        yield
    except _PeerFailed as failed:
        raise RankLost(
            f"rank {group.rank} of {group.world}: its {what!r} exchange with the other ranks "
            f"failed ({failed}): a rank stopped, died or was cut off; nothing past the last "
            "snapshot was committed: start the group again, it resumes from there"
        ) from None


def leave_process_group() -> None:
    """Destroy Paddle's default process group now: every reference to it dropped, gloo's threads joined.

    ``paddle.distributed.destroy_process_group`` drops one of the four that Paddle keeps (its
    group manager's); the maps of ``paddle.distributed.collective`` keep the group too, and
    its C++ id map (which Paddle empties only at exit). Once all are dropped, the group's last
    reference goes and its gloo context with its threads.
    """
    import paddle.distributed as dist
    from paddle.base import core
    from paddle.distributed import collective

    if dist.is_initialized():
        dist.destroy_process_group()
    for held in ("_group_map", "_group_map_by_name", "_group_map_backend"):
        getattr(collective, held, {}).clear()
    core.ProcessGroupIdMap.destroy()


@contextmanager
def _peers() -> Iterator[None]:
    """Paddle's errors from talking to the other ranks as `_PeerFailed`.

    gloo raises RuntimeError (a closed connection, its own timeout); the TCP store ValueError
    (a broken pipe to rank 0's store) or RuntimeError.
    """
    try:
        yield
    except (RuntimeError, ValueError, OSError) as exc:
        reason = (str(exc).strip().splitlines() or ["no reason given"])[0][:200]
        raise _PeerFailed(reason) from exc
