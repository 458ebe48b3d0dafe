"""Redis's instructions an event for the consumers' store work, counted by callgrind.

The clock cannot tell a 10% change apart on a shared 2-core machine; an instruction count
can: it varies by 0.3% between runs (Redis seeds its hash tables at random). A redis-server
runs under ``valgrind --tool=callgrind`` and the consumers' sample builder processes the
events against it in process, in batches of 5,000 over 4 partitions (keyed by user, as the producer does): the
sequence, first-seen and, in the ``join`` mode, partition scripts, as the consumers call
them; no broker. Floor, in the same run: the least any store writes for the same events, one
ZADD to the user's sequence and one HSET of the event's id an event, sent as plain pipelined
commands to a second such server; ``ratio_to_floor`` is how many times that streamrec spends.
A server's idle cost (start, a PING, shutdown) is measured too and taken off both.

    .venv/bin/python bench/redis_instructions.py [--events N] [--data PATH|synthetic|feed]

Needs valgrind (``apt-get install valgrind``); 40,000 events take about a minute. Prints one
JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import redis
from workloads import DEFAULT, label, workload

from streamrec.config import StreamrecConfig
from streamrec.consumers.native_runner import make_builder
from streamrec.consumers.processor import SampleBuilder
from streamrec.events import Event
from streamrec.featurestore import make_feature_store
from streamrec.kafka.partitioning import MURMUR2, partitions_of
from streamrec.kafka.records import Record
from streamrec.local.launch import start_redis
from streamrec.local.ports import free_port

PARTITIONS = 4
TOPIC = "events"
BATCH = 5_000


@contextmanager
def counted_redis(folder: Path, name: str) -> Iterator[tuple[str, list[int]]]:
    """A redis-server under callgrind.

    Its URL, and a list that holds its instruction count once it has stopped.
    """
    out = folder / f"{name}.callgrind"
    port = free_port()
    server = start_redis(
        "127.0.0.1", port, folder, timeout_s=120.0,
        wrapper=["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"],
    )
    count: list[int] = []
    try:
        yield f"redis://127.0.0.1:{port}", count
    finally:
        server.stop(timeout_s=120.0)  # callgrind writes its count as redis-server exits
    found = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.MULTILINE)
    if found is None:
        raise RuntimeError(f"no instruction count in {out}")
    count.append(int(found.group(1)))


def records(events: list[Event]) -> list[Record]:
    """The events as the consumers read them.

    Keyed by user over the partitions (as streamrec's producers put them, murmur2), in order.
    """
    keys = [event.user_id.encode() for event in events]
    offsets = [0] * PARTITIONS
    out = []
    for event, key, partition in zip(events, keys, partitions_of(keys, PARTITIONS, MURMUR2), strict=True):
        out.append(Record(event.to_json(), offsets[partition], topic=TOPIC, partition=partition,
                          key=key, timestamp=event.ts))
        offsets[partition] += 1
    return out


def bench_builder(cfg: StreamrecConfig) -> SampleBuilder:
    """The runners' builder on ``cfg``'s store.

    The runners' builder on ``cfg``'s store, its placement check told the partition count
    the runner reads from the broker.
    """
    builder = make_builder(cfg, make_feature_store(cfg))
    if builder.placement is not None:
        builder.placement.counts = {TOPIC: PARTITIONS}
    return builder


def streamrec_work(
    url: str,
    events: list[Event],
    consumer: dict[str, object],
    features: list[dict[str, object]] | None = None,
) -> int:
    """The sample builder's batches against the store at ``url``; the samples it made.

    ``features``: the declared features (``STREAMREC_FEATURES``) the events carry.
    """
    cfg = StreamrecConfig.model_validate({
        "store": {"url": url, "key_prefix": f"bench-{uuid.uuid4().hex[:8]}"}, "consumer": consumer,
        "features": features or [],
    })
    builder = bench_builder(cfg)
    batch = records(events)
    now_ms = max(e.ts for e in events)  # recorded events: no clock check applies
    samples = 0
    for start in range(0, len(batch), BATCH):
        result = builder.process(batch[start : start + BATCH], now_ms=now_ms)
        builder.commit(result)
        samples += len(result.samples)
    return samples


def floor_work(url: str, events: list[Event]) -> None:
    """One ZADD and one HSET an event, pipelined, in the same batches."""
    client = redis.Redis.from_url(url)
    for start in range(0, len(events), BATCH):
        pipe = client.pipeline(transaction=False)
        for e in events[start : start + BATCH]:
            pipe.zadd(f"seq:{{{e.user_id}}}", {f"{e.event_id}\t{e.item_id}": e.ts})
            pipe.hset(f"ids:{{{e.user_id}}}", e.event_id, e.ts)
        pipe.execute()


def instructions(work: Callable[[str], object], folder: Path, name: str) -> tuple[int, object]:
    """Redis's instructions for ``work(url)`` on a fresh server, and what ``work`` returned."""
    with counted_redis(folder, name) as (url, count):
        returned = work(url)
    return count[0], returned


def main() -> None:
    """Measure and print the figures (``--help`` lists the knobs)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=40_000)
    parser.add_argument("--data", default=DEFAULT, help="a UserBehavior file, synthetic or feed")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("needs valgrind on PATH: apt-get install valgrind")
    events, consumer = workload(args.data, args.events)
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        idle, _ = instructions(lambda url: None, tmp, "idle")
        ours, samples = instructions(lambda url: streamrec_work(url, events, consumer), tmp, "streamrec")
        floor, _ = instructions(lambda url: floor_work(url, events), tmp, "floor")
    ours_per_event = (ours - idle) / len(events)
    floor_per_event = (floor - idle) / len(events)
    print(json.dumps({
        "bench": "redis_instructions",
        "data": label(args.data),
        "events": len(events),
        "samples": samples,
        "redis_instructions_per_event": round(ours_per_event),
        "floor_instructions_per_event": round(floor_per_event),
        "ratio_to_floor": round(ours_per_event / floor_per_event, 3),
        "idle_instructions": idle,
    }))


if __name__ == "__main__":
    main()
