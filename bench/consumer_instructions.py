"""The consumer's own instructions an event, counted by callgrind.

Its Python work, which is what bounds a consumer process (``bench/consumer_throughput.py``: the
consumer's CPU is its critical path, Redis runs on another core meanwhile).

The clock cannot tell a 10% change apart on a shared 2-core machine (the same code's consumer
CPU an event ranged 29-45 us within an hour); an instruction count repeats to within 0.1%.
The Python process runs under ``valgrind --tool=callgrind`` with its instrumentation switched
on only around the batches: each batch parsed, processed by the consumers' sample builder
against a real redis-server (not counted: another process), and its samples sent with the
runner's own send loop (``ConsumerRunner._fill``) to a producer that holds them (no broker;
purged after each batch), in batches of 5,000 over 4 partitions, as the consumers do.
Floor, in the same run: the least a consumer does with the same records, each one decoded
into an event and one sample of it (no history) encoded and sent the same way.
``ratio_to_floor`` is how many times that streamrec spends.

Instructions are not time: hiredis's and glibc's C runs several instructions a cycle, the
interpreter fewer. Use it to tell whether a change to the consumer's Python made it cheaper,
and the throughput benchmark for what the machine does.

    .venv/bin/python bench/consumer_instructions.py [--events N] [--data PATH|synthetic|feed] [--features 4]

``--features 4`` gives the events four declared behaviour features (``workloads.FOUR_FEATURES``:
shop, brand, three tags, a price), stored with each behaviour and carried by the samples.

Needs valgrind (``apt-get install valgrind``); 20,000 events take about a minute. Prints one
JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from types import SimpleNamespace

import msgspec
from confluent_kafka import Producer
from redis_instructions import BATCH, bench_builder, records
from workloads import DEFAULT, label, with_features, workload

from streamrec.config import StreamrecConfig
from streamrec.consumers.native_runner import ConsumerRunner
from streamrec.events import Event
from streamrec.gcsettings import tune_for_batches
from streamrec.kafka.records import Record
from streamrec.local.launch import start_redis
from streamrec.local.ports import free_port
from streamrec.samples import Sample, encode_sample


def held_producer() -> Producer:
    """A producer that keeps what it is sent: no broker to reach, nothing logged."""
    return Producer({
        "bootstrap.servers": "127.0.0.1:1", "log_level": 0, "linger.ms": 60_000,
        "queue.buffering.max.messages": 2_000_000, "compression.type": "lz4",
    })


def counting(on: bool) -> None:
    """Switch callgrind's instrumentation of this process on or off."""
    subprocess.run(["callgrind_control", f"--instr={'on' if on else 'off'}", str(os.getpid())],
                   check=True, capture_output=True)


def streamrec_work(
    url: str,
    batches: list[list[Record]],
    consumer: dict[str, object],
    now_ms: int,
    features: list[dict[str, object]] | None = None,
) -> int:
    """Parse, build and send every batch as the consumer runner does; the samples made."""
    cfg = StreamrecConfig.model_validate({
        "store": {"url": url, "key_prefix": f"bench-{uuid.uuid4().hex[:8]}"}, "consumer": consumer,
        "features": features or [],
    })
    builder = bench_builder(cfg)
    producer = held_producer()
    runner = SimpleNamespace(_cfg=cfg)  # what the runner's send loop reads
    samples = 0
    counting(True)
    for batch in batches:
        result = builder.process(batch, parsed=builder.parse(batch, now_ms))
        ConsumerRunner._fill(runner, producer, result=result)  # type: ignore[arg-type]
        builder.commit(result)
        samples += len(result.samples)
        producer.purge()
    counting(False)
    return samples


def floor_work(batches: list[list[Record]]) -> int:
    """Each record decoded into an event, and one sample of it encoded and sent."""
    producer = held_producer()
    send, decode, topic = producer.produce, msgspec.json.Decoder(Event).decode, "samples"
    samples = 0
    counting(True)
    for batch in batches:
        for record in batch:
            e = decode(record.value() or b"")  # every recorded event has a value
            sample = Sample(e.event_id, e.user_id, e.ts, e.item_id, e.category_id, 1, (), ())
            send(topic, encode_sample(sample), e.user_id.encode(), -1, None, None, e.ts)
            samples += 1
        producer.purge()
    counting(False)
    return samples


def child(args: argparse.Namespace) -> None:
    """One side, in the process callgrind runs: prints its events and the samples it made."""
    events, consumer = workload(args.data, args.events)
    events, features = with_features(events, args.features)
    recorded = records(events)
    batches = [recorded[i : i + BATCH] for i in range(0, len(recorded), BATCH)]
    now_ms = max(e.ts for e in events)  # recorded events: no clock check applies
    tune_for_batches()  # as `streamrec consumers run` does
    if args.child == "floor":
        print(len(events), floor_work(batches))
        return
    with tempfile.TemporaryDirectory() as folder:
        port = free_port()
        server = start_redis("127.0.0.1", port, Path(folder))
        try:
            url = f"redis://127.0.0.1:{port}"
            print(len(events), streamrec_work(url, batches, consumer, now_ms, features))
        finally:
            server.stop()


def instructions(side: str, args: argparse.Namespace, folder: Path) -> tuple[int, int, int]:
    """The instructions ``side`` counted, its events and the samples it made."""
    out = folder / f"{side}.callgrind"
    command = [
        "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
        sys.executable, __file__, "--child", side, "--data", args.data, "--events", str(args.events),
        "--features", str(args.features),
    ]
    # the same hash seed each run: sets and dicts of strings iterate in the same order
    done = subprocess.run(command, check=True, capture_output=True, text=True,
                          env={**os.environ, "PYTHONHASHSEED": "0"})
    found = re.search(r"^totals: (\d+)", out.read_text(), re.MULTILINE)
    if found is None:
        raise RuntimeError(f"no instruction count in {out}")
    events, samples = done.stdout.split()[-2:]
    return int(found.group(1)), int(events), int(samples)


def main() -> None:
    """Measure and print the figures (``--help`` lists the knobs)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--data", default=DEFAULT, help="a UserBehavior file, synthetic or feed")
    parser.add_argument("--features", type=int, default=0, help="behaviour features declared: 0 or 4")
    parser.add_argument("--child", choices=["streamrec", "floor"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if shutil.which("valgrind") is None:
        sys.exit("needs valgrind on PATH: apt-get install valgrind")
    with tempfile.TemporaryDirectory() as folder:
        ours, events, samples = instructions("streamrec", args, Path(folder))
        floor, _, _ = instructions("floor", args, Path(folder))
    print(json.dumps({
        "bench": "consumer_instructions",
        "data": label(args.data),
        "events": events,
        "samples": samples,
        "features": args.features,
        "consumer_instructions_per_event": round(ours / events),
        "floor_instructions_per_event": round(floor / events),
        "ratio_to_floor": round(ours / floor, 3),
    }))


if __name__ == "__main__":
    main()
