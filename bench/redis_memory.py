"""Redis memory a user and an event for the consumers' store, for sizing a deployment.

The consumers' sample builder processes the events in process against a fresh redis-server
(in batches of 5,000 over 4 partitions, as ``redis_instructions.py`` does; no broker), and
Redis's ``used_memory`` after, less before, is divided by the distinct users and by the
events, and by the behaviours the sequences hold; the sequences' own ``MEMORY USAGE`` a user
and a behaviour apart (``used_memory`` also holds the event ids and the items' first-seen
times). Each sequence's encoding is counted
(``OBJECT ENCODING``: ``listpack``, the compact one, or ``skiplist``), with its mean
``MEMORY USAGE`` and the longest member (Redis keeps a sorted set compact up to
``zset-max-listpack-entries``, 128, entries of up to ``zset-max-listpack-value``, 64 bytes).
Sequences are capped at ``STREAMREC_MODEL__SEQUENCE_LENGTH`` (50) behaviours, so a user's
bytes grow with their events only up to that; event ids are kept for
``STREAMREC_CONSUMER__DEDUP_HORIZON_MS`` of the user's event time.

    .venv/bin/python bench/redis_memory.py [--events N] [--data PATH|synthetic|feed] [--features 4]

``--features 4`` gives the events four declared behaviour features (``workloads.FOUR_FEATURES``:
shop, brand, three tags, a price), stored in each sequence entry after its action.

Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import redis
from redis_instructions import streamrec_work
from workloads import DEFAULT, label, with_features, workload

from streamrec.local.launch import start_redis
from streamrec.local.ports import free_port


def used_memory(url: str) -> int:
    """Redis's ``used_memory``, in bytes."""
    return int(redis.Redis.from_url(url).info("memory")["used_memory"])


def sequences(url: str) -> dict[str, object]:
    """Each sequence key's encoding and bytes, counted by encoding; behaviours and the longest member."""
    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match="*:seq:*", count=1_000))
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.object("encoding", key)
        pipe.memory_usage(key, samples=0)
        pipe.zcard(key)
        pipe.zrange(key, 0, -1)
    replies = pipe.execute()
    by: dict[str, list[int]] = {}
    behaviours = longest = 0
    for k in range(len(keys)):
        encoding, usage, size, members = replies[4 * k : 4 * k + 4]
        name = encoding.decode() if isinstance(encoding, bytes) else str(encoding)
        by.setdefault(name, []).append(int(usage))
        behaviours += int(size)
        longest = max([longest, *map(len, members)])
    total = sum(sum(v) for v in by.values())
    return {
        "behaviours": behaviours,
        "sequence_bytes_per_user": round(total / max(1, len(keys))),
        "sequence_bytes_per_behaviour": round(total / max(1, behaviours)),
        "longest_member_bytes": longest,
        "encodings": {name: len(sizes) for name, sizes in sorted(by.items())},
        "sequence_bytes_by_encoding": {name: round(sum(v) / len(v)) for name, v in sorted(by.items())},
    }


def main() -> None:
    """Run the workload into a fresh Redis and print its bytes a user and an event."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=40_000)
    parser.add_argument("--data", default=DEFAULT, help="a UserBehavior file, synthetic or feed")
    parser.add_argument("--features", type=int, default=0, help="behaviour features declared: 0 or 4")
    args = parser.parse_args()
    events, consumer = workload(args.data, args.events)
    events, features = with_features(events, args.features)
    with tempfile.TemporaryDirectory() as folder:
        port = free_port()
        server = start_redis("127.0.0.1", port, Path(folder))
        try:
            url = f"redis://127.0.0.1:{port}"
            before = used_memory(url)
            samples = streamrec_work(url, events, consumer, features)
            grown = used_memory(url) - before
            keys = int(redis.Redis.from_url(url).dbsize())
            seqs = sequences(url)
        finally:
            server.stop()
    users = len({e.user_id for e in events})
    print(json.dumps({
        "bench": "redis_memory",
        "data": label(args.data),
        "events": len(events),
        "features": args.features,
        "users": users,
        "samples": samples,
        "keys": keys,
        "used_memory_bytes": grown,
        "bytes_per_user": round(grown / users),
        "bytes_per_event": round(grown / len(events)),
        "bytes_per_behaviour": round(grown / max(1, int(str(seqs["behaviours"])))),
        **seqs,
    }))


if __name__ == "__main__":
    main()
