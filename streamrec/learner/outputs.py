"""What a learner's calls return, checked where the loop and the backtester use it.

A user's learner (``STREAMREC_MODEL__LEARNER``) is any class with the contract's methods;
what they return is only promised. Scores of the wrong shape failed deep in the metrics
with a traceback, NaN scores were averaged into the figures without a word, and a
``learn_many`` returning ``None`` failed where its result was read. So the results are
checked as they come, and a broken one stops the run in one line naming the learner and
what it returned (`streamrec.learner.check_learner` finds the same before a run).

Examples:
    >>> import numpy as np
    >>> checked_scores(np.array([0.25, 0.75]), 2, "my:Rate")
    array([0.25, 0.75])
    >>> checked_scores(np.array([0.5, np.nan]), 2, "my:Rate")
    Traceback (most recent call last):
    ...
    streamrec.errors.LearnerContractError: learner my:Rate: predict_many returned 1 of 2 scores not finite
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import numpy as np

from streamrec.errors import LearnerContractError, LearnerFailed, StreamrecError
from streamrec.learner.base import TrainResult
from streamrec.wording import plural


def learner_name(learner: object) -> str:
    """``module:ClassName`` of ``learner``'s class, as ``STREAMREC_MODEL__LEARNER`` names one."""
    cls = type(learner)
    return f"{cls.__module__}:{cls.__qualname__}"


def checked_scores(scores: object, size: int, who: str, finite: bool = True) -> np.ndarray:
    """``scores`` as float64 ``[size]``, each within [0, 1] and (with ``finite``) finite.

    The live loop checks finiteness only after training, and only when no step was skipped: a
    model gone non-finite (NaN weights) scores NaN and skips its steps, and its own guard
    (`TrainingDiverged` after ``max_bad_batches``) stops it.

    Raises:
        LearnerContractError: they are not.
    """
    if scores is None or not hasattr(scores, "__len__"):
        _broke(who, f"predict_many returned {type(scores).__name__}; expected a numpy array of {size} scores")
    array = np.asarray(scores)
    if array.shape != (size,):
        _broke(who, f"predict_many returned scores of shape {array.shape} for {plural(size, 'sample')}; "
               f"expected ({size},)")
    if array.dtype.kind not in "fiub":
        _broke(who, f"predict_many returned scores of dtype {array.dtype}; expected numbers")
    array = array.astype(np.float64, copy=False)
    bad = int((~np.isfinite(array)).sum())
    if bad and finite:
        _broke(who, f"predict_many returned {bad} of {size} scores not finite")
    outside = int(((array < 0) | (array > 1)).sum())  # NaN is neither
    if outside:
        _broke(who, f"predict_many returned {outside} of {size} scores outside [0, 1]")
    return array


def checked_known(known: object, size: int, who: str) -> np.ndarray:
    """``known`` as bool ``[size]``.

    Raises:
        LearnerContractError: it is not.
    """
    if not isinstance(known, np.ndarray) or known.shape != (size,) or known.dtype != np.bool_:
        what = f"{known.dtype} {known.shape}" if isinstance(known, np.ndarray) else type(known).__name__
        _broke(who, f"is_known returned {what} for {plural(size, 'sample')}; expected bool ({size},)")
    return known


def checked_result(result: object, who: str) -> TrainResult:
    """``result`` if it is a `TrainResult`.

    Raises:
        LearnerContractError: it is not.
    """
    if not isinstance(result, TrainResult):
        _broke(who, f"learn_many returned {type(result).__name__}, not a TrainResult")
    return result


def _broke(who: str, what: str) -> NoReturn:
    raise LearnerContractError(f"learner {who}: {what}")


@contextmanager
def raised_by(who: str, method: str, where: str) -> Iterator[None]:
    """Name the learner ``who`` and its ``method`` when the call inside raises.

    A user's class raising in its own code came out as a raw traceback, the run's frames around
    theirs. Ours (`StreamrecError`) pass as they are: they already say what to do.

    Raises:
        LearnerFailed: ``who``, ``method``, what it raised and ``where`` (the run's position),
            chained to the exception, its frames from ``method`` down kept as text.
    """
    try:
        yield
    except StreamrecError:
        raise
    except Exception as exc:
        said = str(exc).strip().splitlines()
        what = type(exc).__name__ + (f": {said[0]}" if said else "")
        raise LearnerFailed(f"learner {who}: {method} raised {what} ({where})", _frames(exc, method)) from exc


def _frames(exc: BaseException, method: str) -> str:
    """``exc``'s traceback from the first frame of ``method`` (the learner's) down, as Python prints it."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_name != method:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))
