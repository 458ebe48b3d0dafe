"""Redis memory a user and an event for the consumers' store, for sizing a deployment.

The consumers' sample builder processes the events in process against a fresh redis-server
(in batches of 5,000 over 4 partitions, as ``redis_instructions.py`` does; no broker), and
Redis's ``used_memory`` after, less before, is divided by the distinct users and by the
events. Sequences are capped at ``STREAMREC_MODEL__SEQUENCE_LENGTH`` (50) behaviours, so a
user's bytes grow with their events only up to that; event ids are kept for
``STREAMREC_CONSUMER__DEDUP_HORIZON_MS`` of the user's event time.

    .venv/bin/python bench/redis_memory.py [--events N] [--data PATH|synthetic|feed]

Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import redis
from redis_instructions import streamrec_work
from workloads import DEFAULT, label, workload

from streamrec.local.launch import start_redis
from streamrec.local.ports import free_port


def used_memory(url: str) -> int:
    """Redis's ``used_memory``, in bytes."""
    return int(redis.Redis.from_url(url).info("memory")["used_memory"])


def main() -> None:
    """Measure Redis bytes a user and an event, and print them."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=40_000)
    parser.add_argument("--data", default=DEFAULT, help="a UserBehavior file, synthetic or feed")
    args = parser.parse_args()
    events, consumer = workload(args.data, args.events)
    with tempfile.TemporaryDirectory() as folder:
        port = free_port()
        server = start_redis("127.0.0.1", port, Path(folder))
        try:
            url = f"redis://127.0.0.1:{port}"
            before = used_memory(url)
            samples = streamrec_work(url, events, consumer)
            grown = used_memory(url) - before
            keys = int(redis.Redis.from_url(url).dbsize())
        finally:
            server.stop()
    users = len({e.user_id for e in events})
    print(json.dumps({
        "bench": "redis_memory",
        "data": label(args.data),
        "events": len(events),
        "users": users,
        "samples": samples,
        "keys": keys,
        "used_memory_bytes": grown,
        "bytes_per_user": round(grown / users),
        "bytes_per_event": round(grown / len(events)),
    }))


if __name__ == "__main__":
    main()
