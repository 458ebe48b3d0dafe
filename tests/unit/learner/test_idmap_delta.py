"""A delta snapshot of an id map carries the ids a micro-batch touched, not the whole map.

Measured through the public path: an `IdMap`'s state arrays before and after one micro-batch,
diffed by `streamrec.snapshots.delta.make_delta` as a snapshot writer does.
"""

from __future__ import annotations

import numpy as np

from streamrec.config import TableConfig
from streamrec.learner.idmap import IdMap
from streamrec.snapshots.delta import make_delta

IDS = 200_000
TOUCHED = IDS // 100  # 1% of the map seen again
NEW = 500  # and a few ids it has not seen
NONE = np.zeros(0, np.uint64)


def _fingerprints(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(1, 2**63, n, dtype=np.uint64) | np.uint64(1)  # odd: never 0


def test_a_delta_of_a_one_percent_micro_batch_carries_a_small_part_of_the_id_map() -> None:
    rng = np.random.default_rng(7)
    table = TableConfig(name="item", feature="item", rows=4 * IDS, min_count=1, ttl_s=None)
    idmap = IdMap(table)
    known = np.unique(_fingerprints(rng, IDS))
    idmap.observe(known, NONE, 1_000)
    parent = idmap.state_arrays("ids/")
    touched = rng.choice(known, TOUCHED, replace=False)
    fresh = _fingerprints(rng, NEW) + np.uint64(1)  # even: none of the known ones
    idmap.observe(np.concatenate([touched, fresh]), NONE, 2_000)
    files, _ = make_delta({"model": parent}, {"model": idmap.state_arrays("ids/")})
    delta_bytes = sum(a.nbytes for a in files["model"].values())
    # Each changed entry costs its four fields (32 bytes) and a row index (8) per array it
    # changed in: 4 x 16 bytes at most. Twice that is room, a full map is 40x more.
    per_entry = 4 * 16
    assert delta_bytes <= 2 * per_entry * (TOUCHED + NEW), (
        f"{delta_bytes} bytes for {TOUCHED + NEW} changed ids of {len(known)}"
    )
