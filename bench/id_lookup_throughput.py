"""Id lookup throughput against its irreducible part, measured in the same run.

Ceiling: xxh3_64 over the encoded ids alone (the per-id Python work no lookup can avoid).
streamrec: `fingerprint` (the same hash into a numpy array)
then `lookup` (a vectorised binary search) against a
dynamic table holding 1,000,000 ids; half the ids looked up are in it, half are not.

    .venv/bin/python bench/id_lookup_throughput.py [--ids N]

Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import xxhash

from streamrec.config import TableConfig
from streamrec.learner.hashing import fingerprint
from streamrec.learner.idmap import IdMap

TABLE_IDS = 1_000_000


def main() -> None:
    """Measure and print the figures (``--help`` lists the knobs)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--ids", type=int, default=1_000_000)
    args = parser.parse_args()
    table = TableConfig(name="item", feature="item", rows=2 * TABLE_IDS, min_count=1, ttl_s=None)
    idmap = IdMap(table)
    idmap.observe(fingerprint([f"item_{i}" for i in range(TABLE_IDS)]), np.zeros(0, np.uint64), 0)
    ids = [f"item_{i}" for i in range(TABLE_IDS - args.ids // 2, TABLE_IDS + args.ids // 2)]

    start = time.perf_counter()
    list(map(xxhash.xxh3_64_intdigest, map(str.encode, ids)))
    ceiling = len(ids) / (time.perf_counter() - start)

    start = time.perf_counter()
    rows = idmap.lookup(fingerprint(ids))
    rate = len(ids) / (time.perf_counter() - start)
    assert len(set(rows[: len(ids) // 2].tolist())) == len(ids) // 2  # no two ids share a row
    print(json.dumps({
        "bench": "id_lookup_throughput",
        "ids": len(ids),
        "table_ids": TABLE_IDS,
        "map_bytes_per_id": round(idmap.nbytes / TABLE_IDS, 1),
        "ceiling_ids_per_s": round(ceiling),
        "streamrec_ids_per_s": round(rate),
        "ratio_to_ceiling": round(rate / ceiling, 4),
    }))


if __name__ == "__main__":
    main()
