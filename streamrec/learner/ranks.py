"""Data-parallel learner ranks on Paddle's collective engine (gloo on CPU, NCCL on GPU).

A group of ``world`` learner processes, started by ``python -m paddle.distributed.launch``
(``streamrec learner run --workers N`` starts it for one host), joins with
``paddle.distributed.init_parallel_env`` and talks only through its collectives: no
transport of our own.

`RankShare` is what a learner needs: its rank and the group's size, its share of each
mini-batch and the ``paddle.DataParallel`` wrapper that all-reduces the gradients in the
backward pass (dense ones summed; an embedding's sparse row gradients all-gathered, rows and
values, so each rank applies every rank's rows). `RankGroup` is what the loop needs: it
all-gathers each rank's micro-batch and positions, so every rank trains the same micro-batch
and rank 0 snapshots every rank's positions.

Every collective is bounded: a rank that waits longer than ``timeout_s`` for the others
(one of them killed, frozen, or cut off) logs why and leaves the process with exit status
`LOST_RANK`; gloo itself fails at once when a peer's connection closes.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np
import paddle

from streamrec.learner.batch import EncodedBatch

logger = logging.getLogger(__name__)

# The exit status of a rank that gave up waiting for the others.
LOST_RANK = 75


def launched_world() -> tuple[int, int]:
    """(rank, world) from ``paddle.distributed.launch``'s environment; (0, 1) outside it."""
    world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    rank = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
    return rank, world


@dataclass(frozen=True)
class RankShare:
    """One rank's part in data-parallel training."""

    rank: int
    world: int

    def wrap(self, module: paddle.nn.Layer) -> paddle.nn.Layer:
        """``module`` whose backward pass all-reduces its gradients across the ranks."""
        return paddle.DataParallel(module) if self.world > 1 else module

    def share(self, part: EncodedBatch) -> tuple[EncodedBatch, float]:
        """This rank's contiguous share of a mini-batch, and its loss scale.

        ``paddle.DataParallel`` averages the ranks' gradients, so a share of ``n`` of the
        mini-batch's ``total`` samples scales its mean loss by ``world * n / total``: the
        average is then the gradient of the mean loss over the whole mini-batch. A rank left
        without samples (a mini-batch smaller than the group) still takes part, on one
        padding-only sample with scale 0: it contributes nothing, not even a row.
        """
        total = len(part)
        own = np.array_split(np.arange(total), self.world)[self.rank]
        if len(own):
            return part.take(own), self.world * len(own) / total
        return padding_only(part.take([0])), 0.0


def padding_only(part: EncodedBatch) -> EncodedBatch:
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


class RankGroup:
    """The collectives the learner loop runs, each bounded by ``timeout_s``."""

    def __init__(self, rank: int, world: int, timeout_s: float) -> None:
        """Join the group (``init_parallel_env``) when ``world`` > 1."""
        self.rank, self.world, self.timeout_s = rank, world, timeout_s
        self._deadline: float | None = None
        self._what = ""
        self._lock = threading.Lock()
        if world > 1:
            import paddle.distributed as dist

            dist.init_parallel_env()
            if dist.get_rank() != rank or dist.get_world_size() != world:
                raise RuntimeError("paddle.distributed disagrees with the launcher's rank and size")
            threading.Thread(target=self._watch, name="streamrec-rank-watch", daemon=True).start()

    @property
    def share(self) -> RankShare:
        """This rank's part in training."""
        return RankShare(self.rank, self.world)

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
        while True:
            time.sleep(min(1.0, self.timeout_s / 4))
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
        """Every rank's int64 1-D ``array`` (lengths may differ), in rank order."""
        array = np.ascontiguousarray(array, dtype=np.int64).ravel()
        if self.world == 1:
            return [array]
        import paddle.distributed as dist

        with self.bounded(what):
            lengths: list[paddle.Tensor] = []
            dist.all_gather(lengths, paddle.to_tensor(np.array([len(array)], np.int64)))
            sizes = [int(t.numpy()[0]) for t in lengths]
            padded = np.zeros(max(max(sizes), 1), np.int64)
            padded[: len(array)] = array
            parts: list[paddle.Tensor] = []
            dist.all_gather(parts, paddle.to_tensor(padded))
        return [p.numpy()[:n] for p, n in zip(parts, sizes, strict=True)]

    def gather_bytes(self, values: Sequence[bytes], what: str) -> list[list[bytes]]:
        """Every rank's byte strings, in rank order."""
        lengths = np.array([len(v) for v in values], np.int64)
        blob = np.frombuffer(b"".join(values), np.uint8)
        words = np.zeros((len(blob) + 7) // 8 * 8, np.uint8)
        words[: len(blob)] = blob
        gathered = self.gather(np.concatenate([[len(values)], lengths, words.view(np.int64)]), what)
        out = []
        for array in gathered:
            count = int(array[0])
            sizes = array[1 : 1 + count]
            data = array[1 + count :].view(np.uint8).tobytes()
            ends = np.cumsum(sizes)
            out.append([data[e - s : e] for s, e in zip(sizes, ends, strict=True)])
        return out
