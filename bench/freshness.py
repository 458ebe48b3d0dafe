"""Freshness: how long an event takes to become a sample, to be trained, to be servable.

One host, the real parts, laid out as deployed: generated clicks are produced at ``--rate``
events/s for ``--seconds`` by a process of their own, each stamped with the wall clock as it
is sent (its event time); the native consumer, in a process of its own as ``streamrec
consumers run``, turns them into samples (Redis, the samples topic); the learner trains a
micro-batch every ``--interval`` seconds, snapshots each one, exports and promotes it
(``--promote always``; ``gate`` judges a candidate on the next micro-batch first, one
interval more); a `Scorer` follows the serving pointer as ``streamrec serve`` does (every
``--poll`` s) and loads each promoted version; these two in this process. ``--threads``: the
producer and the consumer as threads of this process too (as before 2026-12-05), sharing its
interpreter lock with the learner, which then trains slower than it would deployed.

Figures, each per sample, p50 and p99 (seconds):

- ``event_to_sample``: event time to its consumer batch's commit (the sample readable);
- ``event_to_trained``: event time to the end of the micro-batch that trained on it;
- ``sample_to_trained``: the commit of its consumer batch to the end of training on it (the
  wait for the interval and the training; matched by event time, a millisecond);
- ``trained_to_servable``: the end of that micro-batch to the scorer loading the first
  version holding it (snapshot, export, promotion, the poll and the load);
- ``event_to_servable``: the whole, event time to servable.

The same figures are the Prometheus metrics (`streamrec.observability.freshness`); here
they are taken exactly from every sample, not from buckets. ``goal_ratio`` is the p99 of
event → servable over its goal, the interval plus 30 s (at most 1 meets it).
``keeping_up``: every micro-batch trained in under the interval, and event → trained p99
in the run's second half no more than in its first half plus one interval (a learner
falling behind makes it grow with the run; ``lag_growth_s`` is the difference of the two
halves' p99). One clock, so no skew; across hosts the metrics assume synchronized clocks.

    .venv/bin/python bench/freshness.py [--rate 300] [--interval 10] [--seconds 60]
        [--poll 1] [--promote always|gate] [--threads]

Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import queue
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from prometheus_client import CollectorRegistry

from streamrec.config import StreamrecConfig
from streamrec.consumers.native_runner import BatchReport, ConsumerRunner
from streamrec.datasets.synthetic import ClickStreamSpec, generate_clicks
from streamrec.events import Event
from streamrec.kafka.topics import ensure_topics
from streamrec.learner.registry import make_learner
from streamrec.learner.runner import LearnerRunner, MicroBatchReport
from streamrec.local.launch import local_services
from streamrec.observability import ConsumerMetrics, LearnerMetrics
from streamrec.observability.freshness import ServedFreshness, ages_s
from streamrec.producer import publish
from streamrec.serving.gate import Promoter
from streamrec.serving.scorer import Scorer
from streamrec.snapshots.store import SnapshotManifest, SnapshotStore

#: How long past the last event the run waits for its samples to become servable: the last
#: interval, a snapshot, an export and a load.
DRAIN_MARGIN_S = 60.0


@dataclass
class Timeline:
    """Every sample's ages, kept exactly, besides the metrics' buckets."""

    event_to_sample: list[np.ndarray] = field(default_factory=list)
    trained: list[tuple[float, np.ndarray]] = field(default_factory=list)  # (end of training, event ts)
    unsnapshotted: list[int] = field(default_factory=list)  # indexes into trained
    in_version: dict[int, list[int]] = field(default_factory=dict)  # version -> indexes into trained
    servable: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)  # (e→t, t→servable)
    train_seconds: list[float] = field(default_factory=list)
    newest_served_ms: int = 0
    served_samples: int = 0
    committed: dict[int, float] = field(default_factory=dict)  # event ts -> its samples' commit time
    sample_to_trained: list[np.ndarray] = field(default_factory=list)
    loaded_versions: set[int] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_commit(self, now: float, ts: list[int]) -> None:
        """A consumer batch committed at ``now``: its samples' event → sample."""
        self.event_to_sample.append(ages_s(now, ts))
        with self.lock:
            self.committed.update(dict.fromkeys(ts, now))

    def on_report(self, report: MicroBatchReport) -> None:
        """A micro-batch trained: keep its event times and when it ended."""
        with self.lock:
            self.unsnapshotted.append(len(self.trained))
            self.trained.append((time.time(), np.asarray(report.event_ts, dtype=np.int64)))
            self.train_seconds.append(report.train_seconds)
            ended = self.trained[-1][0]
            commits = np.array([self.committed.get(int(t), ended) for t in np.unique(report.event_ts)])
            index = np.searchsorted(np.unique(report.event_ts), report.event_ts)
            self.sample_to_trained.append(np.maximum(ended - commits[index], 0.0))

    def on_snapshot(self, manifest: SnapshotManifest) -> None:
        """A version written: it holds every micro-batch trained since the last."""
        with self.lock:
            self.in_version[manifest.version] = self.unsnapshotted
            self.unsnapshotted = []

    def on_load(self, version: int, loaded_at_s: float) -> None:
        """A version loaded for serving: the micro-batches in it and before it are servable."""
        with self.lock:
            for written in sorted(v for v in self.in_version if v <= version):
                for index in self.in_version.pop(written):
                    ended, ts = self.trained[index]
                    e_t = ages_s(ended, ts)
                    self.servable.append((e_t, np.full(len(ts), max(loaded_at_s - ended, 0.0))))
                    self.served_samples += len(ts)
                    self.newest_served_ms = max(self.newest_served_ms, int(ts.max(initial=0)))


def stamped_now(events: list[Event]) -> Iterator[Event]:
    """The events in order, each stamped with the wall clock as it is taken (epoch ms)."""
    last = 0
    for event in events:
        last = max(last, time.time_ns() // 1_000_000)
        yield msgspec.structs.replace(event, ts=last)


def quantiles(parts: list[np.ndarray]) -> dict[str, float]:
    """p50 and p99 of the values of ``parts`` (NaN when there are none)."""
    values = np.concatenate(parts) if parts else np.zeros(0)
    if not len(values):
        return {"p50": float("nan"), "p99": float("nan")}
    p50, p99 = np.quantile(values, [0.5, 0.99])
    return {"p50": round(float(p50), 3), "p99": round(float(p99), 3)}


def follow(
    root: Path, timeline: Timeline, served: ServedFreshness, poll_s: float, stop: threading.Event
) -> None:
    """Load each promoted version as ``serve`` does: wait for the first, then poll the pointer."""
    store = SnapshotStore(root)
    while store.current() is None:
        if stop.wait(poll_s):
            return
    scorer = Scorer(root)
    while True:
        loaded = scorer.loaded
        if loaded is not None and loaded.version not in timeline.loaded_versions:
            timeline.loaded_versions.add(loaded.version)
            served.observe_load(loaded)
            timeline.on_load(loaded.version, loaded.loaded_at_s)
        if stop.wait(poll_s):
            return
        scorer.refresh()


def run_threads(targets: dict[str, Callable[[], object]], stop: threading.Event) -> Callable[[], None]:
    """Start each target in a thread; the returned call stops and joins them, re-raising a failure."""
    failures: list[BaseException] = []

    def guarded(target: Callable[[], object]) -> None:
        try:
            target()
        except BaseException as exc:  # re-raised in the caller's thread
            failures.append(exc)
            stop.set()

    threads = [
        threading.Thread(target=guarded, args=(t,), name=f"bench-{n}", daemon=True)
        for n, t in targets.items()
    ]
    for thread in threads:
        thread.start()

    def finish() -> None:
        stop.set()
        for thread in threads:
            thread.join()
        if failures:
            raise failures[0]

    return finish


def histogram_summary(registry: CollectorRegistry, name: str) -> dict[str, float]:
    """A histogram's count and mean as Prometheus exposes them."""
    count = registry.get_sample_value(f"{name}_count") or 0.0
    total = registry.get_sample_value(f"{name}_sum") or 0.0
    return {"count": count, "mean": round(total / count, 3) if count else float("nan")}


CONSUMER_METRIC = "streamrec_consumer_event_to_sample_seconds"


def produce_stamped(cfg: StreamrecConfig, rate: float, seconds: float, seed: int) -> tuple[int, float]:
    """Publish the generated clicks at ``rate``, each stamped as sent; the count and the seconds taken."""
    events = generate_clicks(ClickStreamSpec(events=max(int(rate * seconds), 1), seed=seed))
    started = time.monotonic()
    published = publish(stamped_now(events), cfg.kafka, rate=rate, schema=cfg.feature_schema())
    return published, time.monotonic() - started


def producer_process(cfg: StreamrecConfig, rate: float, seconds: float, seed: int, out: Any) -> None:
    """The producer as the application's own process: ``("published", count, seconds)`` at the end."""
    out.put(("published", *produce_stamped(cfg, rate, seconds, seed)))


def consumer_process(cfg: StreamrecConfig, out: Any, stop: Any) -> None:
    """A consumer as ``streamrec consumers run`` runs it, in its own process, until ``stop`` is set.

    Each batch's commit goes to ``out`` as ``("commit", time, event times, events so far)``, its
    metric's summary as ``("metrics", summary)`` at the end.
    """
    metrics = ConsumerMetrics()

    def on_batch(report: BatchReport) -> None:
        metrics.observe_batch(report)
        out.put(("commit", time.time(), [s.ts for s in report.result.samples], consumer.stats.events))

    consumer = ConsumerRunner(cfg, on_batch=on_batch)
    stopped = threading.Event()

    def relay() -> None:
        stop.wait()
        stopped.set()

    threading.Thread(target=relay, daemon=True).start()
    consumer.run(stopped)
    out.put(("metrics", histogram_summary(metrics.registry, CONSUMER_METRIC)))


def measure(
    cfg: StreamrecConfig, rate: float, seconds: float, poll_s: float, *, processes: bool = True, seed: int = 7
) -> dict[str, Any]:
    """Run the stream at ``rate`` for ``seconds``, until every sample is servable; the figures.

    ``processes``: the producer and the consumer each in a process of their own, as they run
    beside ``streamrec learner run`` (the learner and serving's loads here); otherwise every
    part in a thread of this process, sharing its interpreter lock.
    """
    ensure_topics(cfg.kafka)
    timeline = Timeline()
    consumer_metrics, learner_metrics = ConsumerMetrics(), LearnerMetrics()
    serving_registry = CollectorRegistry()
    served = ServedFreshness(serving_registry)
    store = SnapshotStore(cfg.learner.snapshot_dir, full_every=cfg.learner.full_snapshot_every)
    promoter = Promoter(store, cfg.learner)

    def on_batch(report: BatchReport) -> None:
        consumer_metrics.observe_batch(report)
        timeline.on_commit(time.time(), [s.ts for s in report.result.samples])

    def on_report(report: MicroBatchReport) -> None:
        learner_metrics.observe_report(report)
        timeline.on_report(report)

    def on_snapshot(manifest: SnapshotManifest) -> None:
        timeline.on_snapshot(manifest)
        learner_metrics.observe_snapshot(manifest)
        promoter.on_snapshot(manifest)

    learner = LearnerRunner(
        cfg,
        make_learner(cfg.model, cfg.feature_schema()),
        on_report=on_report,
        on_snapshot=on_snapshot,
        snapshots=store,
        on_scored=promoter.on_scored,
    )
    stop = threading.Event()
    threads: dict[str, Callable[[], object]] = {
        "learner": lambda: learner.run(stop),
        "serve": lambda: follow(store.root, timeline, served, poll_s, stop),
    }
    if processes:
        children = Children(cfg, rate, seconds, seed, timeline)
        threads["consumer"] = lambda: children.drain(stop)
    else:
        consumer = ConsumerRunner(cfg, on_batch=on_batch)
        threads["consumer"] = lambda: consumer.run(stop)
    finish = run_threads(threads, stop)
    try:
        if processes:
            published, produce_s = children.produced(stop)
        else:
            published, produce_s = produce_stamped(cfg, rate, seconds, seed)
        deadline = time.monotonic() + cfg.learner.interval_s + DRAIN_MARGIN_S
        while not stop.is_set() and time.monotonic() < deadline:
            samples = sum(len(a) for a in timeline.event_to_sample)
            consumed = children.consumed if processes else consumer.stats.events
            if consumed >= published and samples and timeline.served_samples >= samples:
                break
            time.sleep(0.2)
    finally:
        if processes:
            children.stop()
        finish()
    consumer_summary = (
        children.metrics if processes else histogram_summary(consumer_metrics.registry, CONSUMER_METRIC)
    )
    return figures(cfg, timeline, rate, seconds, published, produce_s) | {
        "layout": "processes" if processes else "threads",
        "metrics": {CONSUMER_METRIC: consumer_summary}
        | {
            name: histogram_summary(registry, name)
            for registry, name in (
                (learner_metrics.registry, "streamrec_learner_event_to_trained_seconds"),
                (serving_registry, "streamrec_serving_trained_to_servable_seconds"),
                (serving_registry, "streamrec_serving_event_to_servable_seconds"),
            )
        },
    }


class Children:
    """The producer and the consumer, each in a process of its own (spawned: no inherited threads)."""

    def __init__(self, cfg: StreamrecConfig, rate: float, seconds: float, seed: int, timeline: Timeline):
        context = multiprocessing.get_context("spawn")
        self._out: Any = context.Queue()
        self._stop = context.Event()
        self._timeline = timeline
        self._published: tuple[int, float] | None = None
        self.consumed = 0
        self.metrics: dict[str, float] = {}
        self._processes = [
            context.Process(target=consumer_process, args=(cfg, self._out, self._stop), name="consumer"),
            context.Process(
                target=producer_process, args=(cfg, rate, seconds, seed, self._out), name="producer"
            ),
        ]
        for process in self._processes:
            process.start()

    def drain(self, stop: threading.Event) -> None:
        """Take the children's messages until both have ended (run in a thread)."""
        while any(p.is_alive() for p in self._processes) or not self._out.empty():
            try:
                message = self._out.get(timeout=0.2)
            except queue.Empty:
                continue
            if message[0] == "commit":
                _, now, ts, self.consumed = message
                self._timeline.on_commit(now, ts)
            elif message[0] == "published":
                self._published = (message[1], message[2])
            else:
                self.metrics = message[1]
        failed = [f"{p.name} exited {p.exitcode}" for p in self._processes if p.exitcode]
        # Once the run is stopped (a failure elsewhere), a producer cut short is no failure of its own.
        if failed and not stop.is_set():
            raise RuntimeError(", ".join(failed))

    def produced(self, stop: threading.Event) -> tuple[int, float]:
        """Wait for the producer to finish: the events it published and the seconds it took."""
        while self._published is None:
            if stop.wait(0.2):
                raise RuntimeError("stopped before the producer finished")
        return self._published

    def stop(self) -> None:
        """Stop the consumer, and the producer if a failure cut the run short; wait for both."""
        self._stop.set()
        producer = self._processes[1]
        if producer.is_alive() and self._published is None:
            producer.terminate()
        for process in self._processes:
            process.join()


def figures(
    cfg: StreamrecConfig, timeline: Timeline, rate: float, seconds: float, published: int, produce_s: float
) -> dict[str, Any]:
    """The run's figures from its timeline."""
    interval = cfg.learner.interval_s
    t2s = [t for _, t in timeline.servable]
    e2servable = [e + t for e, t in timeline.servable]
    half = len(timeline.trained) // 2
    by_batch = [ages_s(ended, ts) for ended, ts in timeline.trained]
    first, second = quantiles(by_batch[:half] or by_batch), quantiles(by_batch[half:])
    growth = second["p99"] - first["p99"]
    sampled = sum(len(a) for a in timeline.event_to_sample)
    total = quantiles(e2servable)
    return {
        "rate": rate,
        "interval_s": interval,
        "seconds": seconds,
        "events": published,
        "produced_rate": round(published / produce_s, 1) if produce_s > 0 else None,
        "samples": sampled,
        "samples_trained": sum(len(ts) for _, ts in timeline.trained),
        "samples_servable": timeline.served_samples,
        "micro_batches": len(timeline.trained),
        "versions_served": len(timeline.loaded_versions),
        "max_train_s": round(max(timeline.train_seconds, default=float("nan")), 3),
        "event_to_sample": quantiles(timeline.event_to_sample),
        "event_to_trained": quantiles(by_batch),
        "sample_to_trained": quantiles(timeline.sample_to_trained),
        "trained_to_servable": quantiles(t2s),
        "event_to_servable": total,
        "goal_s": interval + 30.0,
        "goal_ratio": round(total["p99"] / (interval + 30.0), 3),
        "lag_growth_s": round(growth, 3),
        "keeping_up": bool(
            max(timeline.train_seconds, default=0.0) < interval
            and growth <= interval
            and timeline.served_samples >= sampled > 0
        ),
    }


def main() -> None:
    """Measure and print the figures (``--help`` lists the knobs)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=300.0, help="events/s produced")
    parser.add_argument("--interval", type=float, default=10.0, help="the learner's micro-batch interval, s")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long events are produced")
    parser.add_argument("--poll", type=float, default=1.0, help="serve's pointer poll, s")
    parser.add_argument("--promote", choices=("always", "gate"), default="always")
    parser.add_argument(
        "--threads",
        action="store_true",
        help="producer and consumer as threads of the learner's process (before 2026-12-05; not as deployed)",
    )
    args = parser.parse_args()
    with local_services() as services, tempfile.TemporaryDirectory() as tmp:
        name = uuid.uuid4().hex[:8]
        cfg = StreamrecConfig.model_validate(
            {
                "kafka": {
                    "bootstrap_servers": services.bootstrap_servers,
                    "events_topic": f"ev-{name}",
                    "samples_topic": f"s-{name}",
                    "dlq_topic": f"d-{name}",
                    "samples_dlq_topic": f"sd-{name}",
                },
                "store": {"url": services.redis_url, "key_prefix": f"f-{name}:"},
                "consumer": {"group_id": f"c-{name}"},
                "learner": {
                    "group_id": f"l-{name}",
                    "interval_s": args.interval,
                    "snapshot_every": 1,
                    "snapshot_dir": str(Path(tmp) / "snapshots"),
                    "promote": args.promote,
                },
            }
        )
        result = measure(cfg, args.rate, args.seconds, args.poll, processes=not args.threads)
    print(json.dumps({"bench": "freshness", "promote": args.promote, "poll_s": args.poll, **result}))


if __name__ == "__main__":
    main()
