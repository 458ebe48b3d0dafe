"""Tests for ``streamrec.learner.hashing``: stable, in range, well spread.

Its speed is measured by ``bench/hashing_throughput.py``, not here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from streamrec.learner.hashing import bucketize, distinct_fingerprints, fingerprint, first_positions


def test_known_values_never_change() -> None:
    """Snapshots and serving depend on these: a change here silently scrambles trained models."""
    assert fingerprint(["item-1", ""]).tolist() == [0xA8ED576B406035B2, 0x2D06800538D394C2]
    got = bucketize(["item-1", "item-2", "cat-a", "", "ünïcode"], 1024)
    assert got.tolist() == [784, 738, 689, 782, 356]
    assert bucketize(["item-1"], 2**20).tolist() == [1038106]


def test_range_and_dtype_reserve_padding() -> None:
    got = bucketize([f"id-{i}" for i in range(5000)], 7)
    assert got.dtype == np.int64
    assert got.min() >= 1 and got.max() <= 6
    assert set(got.tolist()) == {1, 2, 3, 4, 5, 6}


def test_two_buckets_map_everything_to_one() -> None:
    assert bucketize(["a", "b", "c"], 2).tolist() == [1, 1, 1]


def test_rejects_fewer_than_two_buckets() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        bucketize(["a"], 1)


def test_empty_input() -> None:
    got = bucketize([], 1024)
    assert got.shape == (0,) and got.dtype == np.int64


def test_stable_across_processes_with_different_hash_seeds() -> None:
    code = "from streamrec.learner.hashing import bucketize; print(bucketize(['x', 'y'], 1024).tolist())"
    outputs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        outputs.add(out.stdout.strip())
    assert outputs == {str(bucketize(["x", "y"], 1024).tolist())}


def test_sequential_ids_spread_evenly() -> None:
    counts = np.bincount(bucketize([f"item_{i}" for i in range(100_000)], 1024), minlength=1024)
    used = counts[1:]
    # Poisson(~98) per bucket: 5 standard deviations either side is a generous band.
    assert used.min() > 98 - 50 and used.max() < 98 + 50


CASES = [[], ["a"], ["b", "a", "b", "c", "a", "a"], [f"i{n % 97}" for n in range(1000)]]


@pytest.mark.parametrize("ids", CASES)
def test_distinct_fingerprints_are_np_unique_of_the_fingerprints(ids: list[str]) -> None:
    distinct, inverse = distinct_fingerprints(first_positions(ids))
    expected, expected_inverse = np.unique(fingerprint(ids), return_inverse=True)
    assert distinct.dtype == np.uint64 and inverse.dtype == np.int64
    np.testing.assert_array_equal(distinct, expected)
    np.testing.assert_array_equal(inverse, expected_inverse.ravel())


def test_one_id_given_as_a_string_is_refused_not_hashed_letter_by_letter() -> None:
    # Found by the Python-API tour: fingerprint("i1") gave two fingerprints, of "i" and of "1".
    with pytest.raises(TypeError, match=r"fingerprint\(\['i1'\]\), not the string 'i1'"):
        fingerprint("i1")


@pytest.mark.parametrize(
    ("ids", "named"),
    [
        ([1, 2], "item 0 of ids is an int 1"),
        (["i1", None], "item 1 of ids is a NoneType None"),
        (["i1", b"i2"], "item 1 of ids is a bytes b'i2'"),
        (5, "not an int 5"),
        (None, "not a NoneType None"),
        ((str(k) for k in range(2)), "not a generator"),
    ],
    ids=["ints", "a None", "bytes", "a number", "None", "a generator"],
)
def test_ids_that_are_not_a_list_of_strings_are_a_type_error_naming_the_argument(
    ids: object, named: str
) -> None:
    """Found by the Python-API tour, left: ``fingerprint([1, 2])`` raised ``TypeError: descriptor
    'encode' for 'str' objects doesn't apply to a 'int' object``, naming neither the argument nor
    the item. The happy path is unchanged: the ids are looked at only once hashing has failed.
    """
    with pytest.raises(TypeError, match=r"fingerprint takes a list of str ids.*" + re.escape(named)):
        fingerprint(ids)  # type: ignore[arg-type]  # the wrong type is the point
