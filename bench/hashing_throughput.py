"""Id hashing throughput against its irreducible part, measured in the same run.

Ceiling: ``zlib.crc32`` over the encoded ids alone (the per-id Python work that hashing cannot
avoid). streamrec: ``bucketize``, which adds the murmur3 finaliser and the bucket modulo in
numpy. Data: 1,000,000 sequential ids, the worst case for a linear hash.

    .venv/bin/python bench/hashing_throughput.py [--ids N]

Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import time
import zlib

from streamrec.learner.hashing import bucketize


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ids", type=int, default=1_000_000)
    args = parser.parse_args()
    ids = [f"item_{i}" for i in range(args.ids)]

    start = time.perf_counter()
    list(map(zlib.crc32, map(str.encode, ids)))
    ceiling = len(ids) / (time.perf_counter() - start)

    start = time.perf_counter()
    bucketize(ids, 2**20)
    rate = len(ids) / (time.perf_counter() - start)
    print(json.dumps({
        "bench": "hashing_throughput",
        "ids": len(ids),
        "ceiling_ids_per_s": round(ceiling),
        "streamrec_ids_per_s": round(rate),
        "ratio_to_ceiling": round(rate / ceiling, 4),
    }))


if __name__ == "__main__":
    main()
