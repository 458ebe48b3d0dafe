"""A backtest's strategies run in processes of their own (``--jobs N``), at most N at once.

Each strategy gets a process started fresh (multiprocessing's spawn: Paddle and librdkafka keep
threads a fork would break) and a pipe of its own: the strategy and the micro-batches go down
it once the process runs (`streamrec.paddlesignals.before_paddle` first: unpickling a strategy
imports Paddle), and its run, or the error it raised, comes back. The command waits on the
pipes: a process that ends without sending (stopped, killed, out of memory) closes its pipe,
and the command then kills the others and raises `StrategyProcessLost`, one line, nothing
written. A command killed outright takes its strategies' processes with it
(`streamrec.orphans.end_with_parent`).

Not ``concurrent.futures.ProcessPoolExecutor``: on Python 3.11 a pool starts a process at each
hand-over, and one that ended while the pool started another left that one out of the pool's
clean-up. The pool then waited on it for good and the command hung (a strategy's process
stopped as it imported Paddle, a few times in a hundred), or the hand-over raised
``OSError: handle is closed``. Here every process started is the command's to end. Nor are
the micro-batches a process's start arguments: multiprocessing writes those into the new
process while it still holds that pipe's reading end itself, so a process that ended as it
read them left the command waiting on the write for good.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING

from streamrec.errors import StrategyProcessLost
from streamrec.orphans import end_with_parent
from streamrec.paddlesignals import before_paddle

if TYPE_CHECKING:  # the strategies import Paddle: a new process imports them after before_paddle
    from streamrec.replay.batches import MicroBatch
    from streamrec.replay.strategies import Progress, Strategy, StrategyRun


def run_in_processes(
    strategies: Sequence[Strategy], batches: Sequence[MicroBatch], jobs: int, on_progress: Progress | None
) -> list[StrategyRun]:
    """Each strategy over ``batches`` in a process of its own, ``jobs`` at once; the runs in order.

    Raises:
        StrategyProcessLost: a process ended before it sent its run; the others are killed.
        Exception: what a strategy raised in its process.
    """
    context = multiprocessing.get_context("spawn")
    runs: dict[int, StrategyRun] = {}
    running: dict[int, tuple[BaseProcess, Connection]] = {}
    waiting = list(range(len(strategies)))
    try:
        while waiting or running:
            while waiting and len(running) < jobs:
                index = waiting.pop(0)
                try:
                    running[index] = _start(context, strategies[index], batches)
                except OSError:  # it ended as it read what it was given
                    raise _lost(strategies, [index, *running, *waiting]) from None
            ready = wait([pipe for _, pipe in running.values()])
            for index, (process, pipe) in list(running.items()):
                if pipe not in ready:
                    continue
                try:
                    ok, outcome = pipe.recv()
                except EOFError:  # it ended without sending
                    raise _lost(strategies, [*running, *waiting]) from None
                del running[index]
                pipe.close()
                process.join()
                if not ok:
                    raise outcome
                runs[index] = outcome
                if on_progress is not None:
                    name = strategies[index].name
                    on_progress(name, len(batches), len(batches), float("nan"))
    finally:
        for process, pipe in running.values():  # an error, or the command stopped: none left behind
            process.kill()
            process.join()
            pipe.close()
    return [runs[i] for i in range(len(strategies))]


def _start(
    context: multiprocessing.context.SpawnContext, strategy: Strategy, batches: Sequence[MicroBatch]
) -> tuple[BaseProcess, Connection]:
    """A started process running ``strategy``, and the pipe its run comes back on.

    Raises:
        OSError: the process ended as it read the strategy and the micro-batches (it is reaped).
    """
    pipe, theirs = context.Pipe()
    process = context.Process(target=_run, args=(theirs, os.getpid()), name=strategy.name, daemon=True)
    process.start()
    theirs.close()  # the process holds its end alone: if it ends, the pipe breaks
    try:
        pipe.send((strategy, batches))
    except OSError:  # it ended as it read them
        process.kill()
        process.join()
        pipe.close()
        raise
    return process, pipe


def _lost(strategies: Sequence[Strategy], unfinished: list[int]) -> StrategyProcessLost:
    """The one-line error for a strategy's process that ended before sending its run."""
    names = ", ".join(strategies[i].name for i in unfinished)
    return StrategyProcessLost(
        f"a strategy's process ended before its run finished (unfinished: {names}; stopped, killed, "
        "or out of memory); nothing was written: run again, with fewer --jobs if memory ran out"
    )


def _run(pipe: Connection, command: int) -> None:
    """In the strategy's process: the strategy and micro-batches in, the run or its error out.

    It ends with ``command`` (its parent's pid): a command killed outright cannot end it, and its
    run could no longer be taken.
    """
    end_with_parent(command)
    before_paddle()
    from streamrec.replay.strategies import run_strategy

    strategy, batches = pipe.recv()
    try:
        outcome: tuple[bool, object] = (True, run_strategy(strategy, batches))
    except Exception as exc:  # handed to the command, which raises it
        outcome = (False, exc)
    pipe.send(outcome)
    pipe.close()
