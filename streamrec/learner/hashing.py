"""Stable 64-bit fingerprints of string ids, and hashing them into fixed tables.

A fingerprint is the id's UTF-8 bytes under xxh3_64 (python-xxhash, the reference C
implementation, also available in every language a serving stack is written in): the same
in every process and on every machine, which rules out Python's salted ``hash()``. Dynamic
tables (`streamrec.learner.idmap`) key ids by it; hashed tables and the user counts of
`streamrec.learner.idstats` take it modulo their rows.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import xxhash

from streamrec.errors import a_kind

# Row 0 is the padding row of every embedding table; ids hash into 1..buckets-1.
PADDING_BUCKET = 0


def fingerprint(ids: Sequence[str]) -> np.ndarray:
    """uint64 [len(ids)]: xxh3_64 of each id's UTF-8 bytes, seed 0.

    Examples:
        The same in every process, on every machine, in every language with an xxh3:

        >>> fingerprint(["i1", "i2"])
        array([5646418012223857726, 4906504746856298613], dtype=uint64)

    Raises:
        TypeError: ``ids`` is one string (a sequence of its letters), is no list, or holds an
            id that is not a str; the message names the item.
    """
    if isinstance(ids, str):
        raise TypeError(f"fingerprint takes a list of ids: fingerprint([{ids!r}]), not the string {ids!r}")
    try:
        hashed = map(xxhash.xxh3_64_intdigest, map(str.encode, ids))
        return np.fromiter(hashed, dtype=np.uint64, count=len(ids))
    except TypeError as exc:  # looked into only now: the hot path pays nothing for the check
        wrong = _not_ids(ids)
        if wrong is None:
            raise
        raise wrong from exc


def _not_ids(ids: object) -> TypeError | None:
    """What makes ``ids`` no list of str ids, as the error to raise; None if it is one."""
    if not hasattr(ids, "__len__") or not hasattr(ids, "__iter__"):
        return TypeError(f"fingerprint takes a list of str ids, not {a_kind(ids)} {ids!r:.80}")
    for index, item in enumerate(ids):
        if not isinstance(item, str):
            return TypeError(
                f"fingerprint takes a list of str ids: item {index} of ids is {a_kind(item)} {item!r:.80}"
            )
    return None


#: `first_positions`: each distinct id's first position (in order of first appearance), and
#: int64 [N] each id's.
FirstPositions = tuple[dict[str, int], np.ndarray]


def first_positions(ids: Sequence[str]) -> FirstPositions:
    """Each distinct id of ``ids`` by its first position, and each id's first position, int64 [N].

    One dict pass (Python caches a string's hash): two ids are equal exactly when their first
    positions are, so the positions code the ids as integers.

    Examples:
        >>> first, at = first_positions(["a", "b", "a"])
        >>> first, at
        ({'a': 0, 'b': 1}, array([0, 1, 0]))
    """
    first: dict[str, int] = {}
    at = np.fromiter(map(first.setdefault, ids, itertools.count()), dtype=np.int64, count=len(ids))
    return first, at


def distinct_fingerprints(positions: FirstPositions) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(fingerprint(ids), return_inverse=True)`` from ``first_positions(ids)``.

    A micro-batch's sequences repeat a user's history in each of the user's samples (~70,000
    ids of a few thousand distinct, MovieLens): `first_positions` finds the distinct ones, and
    only they are encoded, hashed and sorted; 1.7-2x faster than hashing and sorting all.
    Returns the sorted distinct uint64 fingerprints and, int64 [N], each id's index into them.
    """
    first, at = positions
    distinct, back = np.unique(fingerprint(list(first)), return_inverse=True)
    rank = np.empty(len(at), dtype=np.int64)  # at an id's first position: its index in distinct
    rank[np.fromiter(first.values(), dtype=np.int64, count=len(first))] = back.ravel()
    return distinct, rank[at]


def bucketize(ids: Sequence[str], buckets: int) -> np.ndarray:
    """Hash string ids into ``1..buckets-1`` (int64), the same way in every process.

    Raises:
        ValueError: If ``buckets`` is below 2 (no row would be left beside padding).

    Examples:
        >>> bucketize(["i1", "i2", "i1"], 1024)
        array([287, 721, 287])
    """
    return to_buckets(fingerprint(ids), buckets)


def to_buckets(fingerprints: np.ndarray, buckets: int) -> np.ndarray:
    """Map `fingerprint` values into ``1..buckets-1`` (int64); row 0 stays padding."""
    if buckets < 2:
        raise ValueError(f"buckets must be at least 2, got {buckets}")
    return (fingerprints % np.uint64(buckets - 1)).astype(np.int64) + 1
