"""Memory of dynamic embedding tables on a long stream with new ids flowing all the time.

A learner with EWC on trains micro-batches whose every item is new (the worst case: nothing
is ever seen again) with an item table capped at ``--rows`` and a one-hour TTL; micro-batches
are an hour of event time apart, each with more new ids than half the cap, so the table
reaches its cap and both the TTL and the least-recently-seen rule take rows back.

Reported: the bytes per table row of everything that scales with rows (weights, wide bias,
Adam moments, EWC Fisher and anchor, id statistics; the EWC accumulator adds one more
weight-sized array in memory, not in snapshots), the id map's bytes per tracked id, and the
process's resident memory at the quarter and at the end of the run: bounded means the end
is no higher than the quarter.

    .venv/bin/python bench/embedding_memory.py [--batches N] [--rows N]

Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import resource
from pathlib import Path

from streamrec.config import ModelConfig
from streamrec.learner.columns import SampleColumns
from streamrec.learner.din import DINLearner
from streamrec.samples import Sample

HOUR_MS = 3_600_000


def rss_bytes() -> int:
    """Resident memory now (Linux), bytes."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize()


def micro_batch(index: int, size: int) -> SampleColumns:
    """``size`` samples, each of a new item, with the previous few as history."""
    items = [f"b{index}-{k}" for k in range(size)]
    return SampleColumns.from_samples([
        Sample(f"{index}-{k}", f"u{k % 50}", index * HOUR_MS + k, item, f"c{k % 100}", k % 2,
               tuple(items[max(0, k - 5) : k]), tuple(f"c{j % 100}" for j in range(max(0, k - 5), k)))
        for k, item in enumerate(items)
    ])


def main() -> None:
    """Measure and print the figures (``--help`` lists the knobs)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=120)
    parser.add_argument("--size", type=int, default=3000)
    parser.add_argument("--rows", type=int, default=2**12)
    args = parser.parse_args()
    cfg = ModelConfig.model_validate({
        "tables": [
            {"name": "item", "feature": "item", "rows": args.rows, "min_count": 1, "ttl_s": 3600.0},
            {"name": "category", "feature": "category", "rows": 1024, "min_count": 1},
        ],
        "ewc_lambda": 1.0, "device": "cpu",
    })
    learner = DINLearner(cfg)
    rss, admitted, evicted = [], 0, 0
    for index in range(args.batches):
        result = learner.learn_many(micro_batch(index, args.size))
        admitted += result.ids_admitted["item"]
        evicted += result.ids_evicted["item"]
        rss.append(rss_bytes())
    state = learner.state_arrays()
    rows = learner.rows["item"]
    per_row = sum(a.nbytes for k, a in state.items() if a.shape[:1] == (rows,) and "/ids/" not in k)
    idmap = learner.id_maps["item"]
    quarter = rss[len(rss) // 4]
    print(json.dumps({
        "bench": "embedding_memory",
        "micro_batches": args.batches,
        "new_ids": admitted,
        "ids_evicted": evicted,
        "table_rows": rows,
        "rows_cap": args.rows,
        "bytes_per_row": round(per_row / rows, 1),
        "id_map_bytes_per_id": round(idmap.nbytes / max(idmap.tracked, 1), 1),  # in memory, index too
        "rss_quarter_bytes": quarter,
        "rss_end_bytes": rss[-1],
        "rss_end_to_quarter": round(rss[-1] / quarter, 4),
    }))


if __name__ == "__main__":
    main()
