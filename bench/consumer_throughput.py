"""Consumer throughput against the broker's own ceiling, measured in the same run.

Ceilings, both timed as the consumer is, from the first batch in hand to the last record:
a bare confluent-kafka batch consume of the same events (each record's value taken; no
parsing, no Redis, no produce), the best of three (see `bare_consume`), and the
forwarding floor, the least a Python consumer of these events does: each decoded, one sample
of it encoded and produced (see `forward_consume`), the best of two. The bare consume
reads about a million records a second here and does not slow with the machine's Python; the
floor does, as the consumers do, so ``ratio_to_floor`` tells streamrec's own cost (Redis,
histories, negatives, the transaction) from the machine's speed that day.

streamrec: the consumer runner end to end (parse, Redis pipeline, samples and
offsets in one transaction per batch). Data: the 2-hour Taobao slice (110k real events) from
../shared/data, or, where that is missing (a fresh clone), 110k generated clicks.

    .venv/bin/python bench/consumer_throughput.py [--events N] [--data PATH|synthetic|feed]
        [--cpu-per-consumer CORES]

``--data feed``: a generated feed log (pages of impressions, clicks on shown items) through
the ``join`` labelling mode, 110k events by default.

Scaling: one consumer process, then two in one group, on a 4-partition topic each (a new
group and key prefix each), the events published once the group has settled; with the
machine's busy cores over the same window (every process on it: the consumers, Redis and the
broker share the cores).

``--cpu-per-consumer 0.4``: each process of the scaling runs is held to 0.4 of a core (a
cgroup of its own; root), so that two of them, Redis and the broker fit in the machine's
cores: the scaling measured is then the consumers' own (group, broker, Redis contention), not
the machine's cores. The first run (ratio, CPU an event) is not held.

``two_to_one_per_busy_core`` compares the two runs' events per busy core of the machine: near
1 when a second process costs no more CPU an event than the first, so that the scaling is
bound by the cores (on a 2-core machine, where one process keeps about 1.5 busy, two can do
at most 2/1.5 = 1.33 times one), not by the consumers.

CPU: over the one-process run, the consumer process's own CPU an event, and Redis's and the
broker's (from ``/proc``); their sum is what an event costs the machine, and
``cores_bound_events_per_s`` the most its cores carry at that cost, with any number of
consumer processes.

Every rate is taken from the first batch read to the last full batch committed (see
`steady_rate`), so group joins, idling and the end of the backlog do not count.

Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from queue import Queue

import msgspec
from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition
from workloads import DEFAULT, label, workload

from streamrec.config import KafkaConfig, StreamrecConfig
from streamrec.consumers.native_runner import BatchReport, ConsumerRunner
from streamrec.events import Event
from streamrec.gcsettings import tune_for_batches
from streamrec.kafka.clients import make_producer, produce
from streamrec.kafka.topics import ensure_topics
from streamrec.local.launch import local_services
from streamrec.producer import publish
from streamrec.samples import Sample, encode_sample

#: How long the bare consume waits for a record before it gives up: the records are on the
#: broker already, so seconds of nothing mean some are missing.
BARE_IDLE_S = 10.0


def timed_read(
    consume: Callable[[int], int], total: int, batch_size: int,
    clock: Callable[[], float] = time.perf_counter, finish: Callable[[], None] = lambda: None,
) -> tuple[int, float]:
    """Time a read of ``total`` records.

    Read ``total`` records with ``consume(n)`` (a batch call asked for at most ``n``, that
    returns how many records it got): the records read after the first batch, and the seconds
    from the first batch in hand to the last record, ``finish()`` after it included (a flush).

    The first batch's call waits for the assignment's start (about 0.5 s on the embedded
    broker), and the consumer's rate is timed from its first batch read too; a call is never
    asked for more records than are left, as one would block for its whole timeout at the end.
    Until the eighth session both waits were on this clock, a second and a half in a read of a
    tenth of a second, and the "ceiling" was the waits' (some 68,000 records a second whatever
    the machine's speed).

    Raises:
        ValueError: every record came in the first batch (nothing left to time).
    """
    seen, start, first = 0, 0.0, 0
    while seen < total:
        got = consume(min(batch_size, total - seen))
        if got and not seen:  # the clock starts with the first batch in hand
            start, first = clock(), got
        seen += got
    finish()
    elapsed = clock() - start
    if seen == first:
        raise ValueError(f"{total} records came in one batch: too few to time a consume")
    return seen - first, elapsed


def bare_consume(
    bootstrap: str, topic: str, partitions: int, total: int, batch_size: int, idle_s: float = BARE_IDLE_S
) -> float:
    """The bare consume: records a second confluent-kafka alone reads.

    Records a second a bare confluent-kafka batch consume reads, each record's value taken,
    timed by `timed_read`. It reads about a million records a second here, from the
    broker and not only from librdkafka's prefetch: 600,000 records, several times what the
    prefetch holds, read as fast once ``fetch.queue.backoff.ms`` is short (its default of 1 s
    pauses fetching for a second whenever the prefetch queue is full, which a consumer slower
    than the broker never notices).

    Raises:
        TimeoutError: no record came for ``idle_s`` with some still to read.
    """
    return _read(bootstrap, topic, partitions, total, batch_size, idle_s,
                 lambda records: sum(1 for m in records if m.error() is None and m.value() is not None))


def forward_consume(kafka: KafkaConfig, total: int, batch_size: int, idle_s: float = BARE_IDLE_S) -> float:
    """Events a second of the least a Python consumer of these events does, timed as the bare consume is.

    Each record decoded into an event (checked against the contract, in C) and one sample of it
    encoded and produced with the consumers' producer settings, until the broker has
    acknowledged the last. No Redis, history, negatives, alignment or transaction. Unlike the
    bare consume it slows with the machine's Python as the consumers do, so the consumers' ratio
    to it tells the cost of their own work from the machine's speed that day.

    Raises:
        TimeoutError: no record came for ``idle_s`` with some still to read.
    """
    producer = make_producer(kafka)
    decode, send, topic = msgspec.json.Decoder(Event).decode, producer.produce, kafka.samples_topic

    def forward(records: list[Message]) -> int:
        for m in records:
            e = decode(m.value() or b"")  # the events are the benchmark's own: all valid
            sample = Sample(e.event_id, e.user_id, e.ts, e.item_id, e.category_id, 1, (), ())
            try:  # as the consumers send: positional, the helper only when the queue is full
                send(topic, encode_sample(sample), e.user_id.encode(), -1, None, None, e.ts)
            except BufferError:
                produce(producer, topic, encode_sample(sample), key=e.user_id.encode(), timestamp_ms=e.ts)
        producer.poll(0)
        return len(records)

    def flush() -> None:
        if producer.flush(30):
            raise TimeoutError("the floor's samples were not acknowledged within 30 s")

    return _read(kafka.bootstrap_servers, kafka.events_topic, kafka.partitions, total, batch_size,
                 idle_s, forward, flush)


def _read(
    bootstrap: str, topic: str, partitions: int, total: int, batch_size: int, idle_s: float,
    handle: Callable[[list[Message]], int], finish: Callable[[], None] = lambda: None,
) -> float:
    """Records a second through ``handle``.

    Records a second through ``handle`` (each batch's records in, how many it took out),
    read from the beginning of every partition of ``topic`` and timed by `timed_read`,
    ``finish`` on the clock.
    """
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-bare-{uuid.uuid4().hex[:8]}",
                         "fetch.queue.backoff.ms": 10})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    idle_since = time.monotonic()

    def consume(most: int) -> int:
        nonlocal idle_since
        got = handle(consumer.consume(most, 1.0))
        if got:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > idle_s:
            raise TimeoutError(f"no record of {topic} for {idle_s:g} s: fewer than {total} there")
        return got

    try:
        read, seconds = timed_read(consume, total, batch_size, finish=finish)
    finally:
        consumer.close()
    return read / seconds


#: One committed batch: when it was read and committed (wall clock, comparable across
#: processes) and its events.
Batch = tuple[float, float, int]


def recorder() -> tuple[list[Batch], Callable[[BatchReport], None]]:
    """A list of batches, and the runner callback that fills it."""
    batches: list[Batch] = []

    def on_batch(report: BatchReport) -> None:
        now = time.time()
        batches.append((now - report.seconds, now, report.result.events))

    return batches, on_batch


def steady_rate(runs: list[list[Batch]], batch_size: int) -> tuple[float, float, float]:
    """Events per second over the runs' full batches, and the window they span.

    The last batches of a finite backlog are small and wait up to the aligner's idle time (2 s)
    for partitions that reached their end: latency at the end of the input, not throughput.
    """
    kept = []
    for batches in runs:
        while batches and batches[-1][2] < batch_size // 2:
            batches = batches[:-1]
        kept += batches
    start, end = min(b[0] for b in kept), max(b[1] for b in kept)
    return sum(b[2] for b in kept) / (end - start), start, end


class CpuQuotas:
    """A CPU quota of its own for each consumer process (``--cpu-per-consumer``).

    A Linux cgroup each, v1 (``/sys/fs/cgroup/cpu``) or v2, made and removed by the benchmark
    (root only). With each consumer held to a fraction of a core, the machine's cores stop being
    the bound, so the scaling measured is the consumers' own: what a machine with a core for
    each consumer, Redis and the broker would show.
    """

    PERIOD_US = 10_000

    def __init__(self, cores: float, count: int) -> None:
        v2 = Path("/sys/fs/cgroup/cgroup.controllers")
        self._root = Path("/sys/fs/cgroup") if v2.exists() else Path("/sys/fs/cgroup/cpu")
        self.paths = [self._root / f"streamrec-bench-{os.getpid()}-{k}" for k in range(count)]
        quota = round(cores * self.PERIOD_US)
        try:
            for path in self.paths:
                path.mkdir()
                if v2.exists():
                    (path / "cpu.max").write_text(f"{quota} {self.PERIOD_US}")
                else:
                    (path / "cpu.cfs_period_us").write_text(str(self.PERIOD_US))
                    (path / "cpu.cfs_quota_us").write_text(str(quota))
        except OSError as exc:
            self.remove()
            raise SystemExit(f"--cpu-per-consumer needs a writable cgroup cpu controller: {exc}") from exc

    def remove(self) -> None:
        """Remove the cgroups made for the consumers (each is empty once its process exited)."""
        for path in self.paths:
            if path.exists():
                path.rmdir()  # empty once its process has exited


def enter_cgroup(path: str) -> None:
    """Move this process (every thread it has) into the cgroup at ``path``."""
    Path(path, "cgroup.procs").write_text(str(os.getpid()))


def consume(
    sections: dict[str, dict[str, object]], ready: Queue[int], share: int, cgroup: str | None = None
) -> tuple[int, list[Batch]]:
    """One consumer process.

    The events it processed and its batches. It says on ``ready`` once it holds its ``share`` of
    the partitions: the group has settled. In ``cgroup`` when given (a CPU quota of its own).
    """
    if cgroup is not None:
        enter_cgroup(cgroup)
    tune_for_batches()  # as `streamrec consumers run` does
    batches, on_batch = recorder()
    runner = ConsumerRunner(StreamrecConfig.model_validate(sections), on_batch=on_batch)

    def settled() -> None:
        while len(runner.assigned()) != share:
            time.sleep(0.05)
        ready.put(os.getpid())

    threading.Thread(target=settled, daemon=True).start()
    stats = runner.run()
    return stats.events, batches


def process_cpu_s() -> float:
    """CPU seconds this process has used, user and system, all threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_s_of(pid: int) -> float:
    """CPU seconds another process has used, user and system, all threads (``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


class CpuSampler:
    """The machine's busy CPU time, sampled in the background.

    The machine's busy CPU time (all processes: consumers, Redis, the broker), sampled from
    /proc/stat every 0.1 s, to tell how busy the cores were over a window afterwards.
    """

    def __init__(self) -> None:
        self._samples: list[tuple[float, float]] = []  # (wall time, busy core-seconds)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        while not self._stop.is_set():
            with open("/proc/stat") as stat:
                fields = [int(x) for x in stat.readline().split()[1:]]
            idle = fields[3] + fields[4]  # idle, iowait
            self._samples.append((time.time(), (sum(fields[:8]) - idle) / tick))
            self._stop.wait(0.1)

    def busy_cores(self, start: float, end: float) -> float | None:
        """Cores busy on average between ``start`` and ``end`` (None when unsampled)."""
        inside = [(t, busy) for t, busy in self._samples if start <= t <= end]
        if len(inside) < 2:
            return None
        (t0, b0), (t1, b1) = inside[0], inside[-1]
        return (b1 - b0) / (t1 - t0)


def scaling(
    sections: dict[str, dict[str, object]], events: list[Event], processes: int,
    cpu_per_consumer: float | None = None,
) -> tuple[float, float | None]:
    """Events per second of a group of consumer processes.

    Events per second of ``processes`` consumers in one group (each its own process, held
    to ``cpu_per_consumer`` cores when given), and how many cores the machine kept busy
    meanwhile. The events are published once the group has settled: a consumer joining late
    would rebalance the group mid-run (seconds of it on the embedded broker), which measures
    the join, not the consumers.
    """
    name = uuid.uuid4().hex[:8]
    own = {
        **sections,
        "kafka": {**sections["kafka"], "events_topic": f"ev-{name}", "samples_topic": f"s-{name}",
                  "dlq_topic": f"d-{name}"},
        "store": {**sections["store"], "key_prefix": f"bench-{name}"},
        # idle while the others join; the idle end is not measured
        "consumer": {**sections["consumer"], "group_id": f"g-{name}", "stop_when_idle_s": 10.0},
    }
    cfg = StreamrecConfig.model_validate(own)
    kafka = cfg.kafka
    ensure_topics(kafka)
    context = multiprocessing.get_context("spawn")
    quotas = CpuQuotas(cpu_per_consumer, processes) if cpu_per_consumer else None
    cgroups = [str(path) for path in quotas.paths] if quotas else [None] * processes
    share = kafka.partitions // processes
    try:
        with context.Manager() as manager, CpuSampler() as cpu, context.Pool(processes) as pool:
            ready = manager.Queue()
            running = pool.starmap_async(consume, [(own, ready, share, cgroup) for cgroup in cgroups])
            for _ in range(processes):
                ready.get(timeout=120)
            publish(events, kafka)
            done = running.get()
    finally:
        if quotas:
            quotas.remove()
    assert sum(n for n, _ in done) == len(events), done
    rate, start, end = steady_rate([batches for _, batches in done], cfg.consumer.batch_size)
    return rate, cpu.busy_cores(start, end)


def main() -> None:
    """Measure and print the figures (``--help`` lists the knobs)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=None, help="default: the whole file")
    parser.add_argument("--data", default=DEFAULT, help="a UserBehavior file, synthetic or feed")
    parser.add_argument("--cpu-per-consumer", type=float, default=None, metavar="CORES",
                        help="hold each process of the scaling runs to this many cores (a cgroup; root)")
    args = parser.parse_args()
    events, settings = workload(args.data, args.events)
    consumer: dict[str, object] = {"stop_when_idle_s": 2.0, **settings}
    with local_services() as services:
        name = uuid.uuid4().hex[:8]
        sections: dict[str, dict[str, object]] = {
            "kafka": {"bootstrap_servers": services.bootstrap_servers, "events_topic": f"ev-{name}",
                      "samples_topic": f"s-{name}", "dlq_topic": f"d-{name}"},
            "store": {"url": services.redis_url},
            "consumer": {"group_id": f"g-{name}", **consumer},
        }
        cfg = StreamrecConfig.model_validate(sections)
        ensure_topics(cfg.kafka)
        publish(events, cfg.kafka)
        ceiling = max(  # the best of three: a tenth of a second each, where noise shows
            bare_consume(services.bootstrap_servers, cfg.kafka.events_topic, cfg.kafka.partitions,
                         len(events), cfg.consumer.batch_size)
            for _ in range(3)
        )
        tune_for_batches()  # as `streamrec consumers run` does; the events held here are frozen
        floor = max(forward_consume(cfg.kafka, len(events), cfg.consumer.batch_size) for _ in range(2))
        batches, on_batch = recorder()
        services_pids = {"redis": services.redis.pid, "broker": services.kafka.pid}
        services_before = {name: cpu_s_of(pid) for name, pid in services_pids.items()}
        cpu_before = process_cpu_s()
        stats = ConsumerRunner(cfg, on_batch=on_batch).run()
        cpu_us = (process_cpu_s() - cpu_before) / stats.events * 1e6
        services_us = {
            name: (cpu_s_of(pid) - services_before[name]) / stats.events * 1e6
            for name, pid in services_pids.items()
        }
        assert stats.events == len(events), stats
        rate = steady_rate([batches], cfg.consumer.batch_size)[0]
        (one, one_busy), (two, two_busy) = (
            scaling(sections, events, processes, args.cpu_per_consumer) for processes in (1, 2)
        )
    print(json.dumps({
        "bench": "consumer_throughput",
        "data": label(args.data),
        "events": stats.events,
        "samples": stats.samples,
        "ceiling_events_per_s": round(ceiling),
        "streamrec_events_per_s": round(rate),
        "ratio_to_ceiling": round(rate / ceiling, 4),
        # the least a Python consumer does with the events (decode, one sample encoded and
        # produced): it slows with the machine as the consumers do
        "floor_events_per_s": round(floor),
        "ratio_to_floor": round(rate / floor, 4),
        # the consumer process's own CPU (all its threads) an event: steadier than rates on a
        # shared machine, and what one core's worth of consumer is spent on
        "consumer_cpu_us_per_event": round(cpu_us, 1),
        # and what Redis and the broker spent on its behalf: with the consumer's, the core time
        # an event costs the machine, which bounds what any number of consumer processes can
        # do on its cores
        "redis_cpu_us_per_event": round(services_us["redis"], 1),
        "broker_cpu_us_per_event": round(services_us["broker"], 1),
        "cores_bound_events_per_s": round(
            (os.cpu_count() or 1) * 1e6 / (cpu_us + services_us["redis"] + services_us["broker"])
        ),
        "partitions": cfg.kafka.partitions,
        # the scaling runs' CPU quota for each consumer process (None: the whole machine)
        "cpu_per_consumer": args.cpu_per_consumer,
        "one_process_events_per_s": round(one),
        "two_processes_events_per_s": round(two),
        "two_to_one": round(two / one, 3),
        # the machine's busy cores (consumers, Redis and broker together) while they ran: at
        # os.cpu_count() the scaling is bound by the cores, not by the consumers
        "busy_cores_one_process": one_busy and round(one_busy, 2),
        "busy_cores_two_processes": two_busy and round(two_busy, 2),
        # the two processes' events per busy core against the one's: 1 when scaling out costs
        # no CPU (no coordination, no contention beyond the cores), whatever the cores bound
        "two_to_one_per_busy_core": (
            round((two / two_busy) / (one / one_busy), 3) if one_busy and two_busy else None
        ),
        "cpu_count": os.cpu_count(),
        "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }))


if __name__ == "__main__":
    main()
