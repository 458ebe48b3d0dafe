"""``streamrec consumers run``: the event consumer process."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.text import Text

from streamrec.cli.common import (
    build_config,
    cli_errors,
    command_group,
    console,
    live_status,
    stop_on_signals,
)
from streamrec.cli.options import ConfigFile, LogLevel, consumer_runner, setting

if TYPE_CHECKING:  # the Kafka and Redis clients: imported when a command runs, not for --help
    from streamrec.config import StreamrecConfig
    from streamrec.consumers.native_runner import BatchReport
    from streamrec.observability import ConsumerMetrics

app = command_group("Window events into Redis sequences and emit training samples.")

# Events per second over the last 10 s: smooths the jitter of half-second batches, and still
# shows a stall within seconds.
RATE_WINDOW_S = 10.0
# A rate over less than a second right after start would turn one batch into a huge figure.
_MIN_RATE_SPAN_S = 1.0


class ConsumerStatus:
    """The live status line: totals, the recent event rate, the last batch's time.

    The rate is read at each redraw, so it falls while no events arrive. Thread-safe: the
    display redraws on its own thread.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, window_s: float = RATE_WINDOW_S) -> None:
        """Start counting now; ``clock`` is monotonic seconds."""
        self._clock = clock
        self._window_s = window_s
        self._started = clock()
        self._recent: deque[tuple[float, int]] = deque()  # (when, events) of recent batches
        self._lock = threading.Lock()
        self.batches = self.events = self.samples = self.dead = 0
        self.batch_seconds = 0.0

    def update(self, report: BatchReport) -> None:
        """Take a committed batch's report."""
        result = report.result
        with self._lock:
            self._recent.append((self._clock(), result.events))
            self.batches += 1
            self.events += result.events
            self.samples += len(result.samples)
            self.dead += len(result.dead)
            self.batch_seconds = report.seconds

    def events_per_second(self) -> float:
        """Events of the batches within the window, over the window (or the run, if shorter,
        but at least a second).
        """
        now = self._clock()
        with self._lock:
            while self._recent and self._recent[0][0] < now - self._window_s:
                self._recent.popleft()
            recent = sum(n for _, n in self._recent)
        return recent / max(min(self._window_s, now - self._started), _MIN_RATE_SPAN_S)

    def line(self) -> str:
        """The status as plain text."""
        if self.batches == 0:
            return "consumers: waiting for events"
        return (
            f"events {self.events:,} ({self.events_per_second():,.0f}/s)  samples {self.samples:,}  "
            f"dead letters {self.dead:,}  last batch {self.batch_seconds:.2f}s"
        )

    def __rich__(self) -> Text:
        """Rendered by the live display at each redraw."""
        return Text(self.line())


def batch_handler(metrics: ConsumerMetrics, status: ConsumerStatus) -> Callable[[BatchReport], None]:
    """The runner's ``on_batch``: metrics and the status line."""

    def on_batch(report: BatchReport) -> None:
        metrics.observe_batch(report)
        status.update(report)

    return on_batch


def serve_metrics(metrics: ConsumerMetrics, cfg: StreamrecConfig) -> None:
    """Serve ``/metrics`` on the configured port, with the group's lag on the events topic
    (a client of the metrics' own asks the broker at each scrape); nothing when off.
    """
    from streamrec.observability import LagProbe, lag_client

    if metrics.serve(cfg.consumer.metrics_port) is None:
        return
    client = lag_client(cfg.kafka, cfg.consumer.group_id)
    metrics.track_lag(LagProbe(client, cfg.kafka.events_topic))


@app.command("run")
def run(
    bootstrap_servers: str | None = setting("kafka.bootstrap_servers"),
    events_topic: str | None = setting("kafka.events_topic"),
    samples_topic: str | None = setting("kafka.samples_topic"),
    dlq_topic: str | None = setting("kafka.dlq_topic"),
    redis_url: str | None = setting("store.url"),
    group_id: str | None = setting("consumer.group_id"),
    negatives: int | None = setting("consumer.negatives"),
    stop_when_idle: float | None = setting("consumer.stop_when_idle_s"),
    metrics_port: int | None = setting("consumer.metrics_port"),
    runner_name: str = consumer_runner(),
    log_level: str | None = LogLevel,
    config_file: Path | None = ConfigFile,
) -> None:
    """Consume events until interrupted (or idle for --stop-when-idle seconds)."""
    from streamrec.consumers.runner_choice import make_runner
    from streamrec.gcsettings import tune_for_batches
    from streamrec.kafka.topics import ensure_topics
    from streamrec.observability import ConsumerMetrics

    with cli_errors():
        cfg = build_config(
            log_level=log_level,
            config_file=config_file,
            kafka={
                "bootstrap_servers": bootstrap_servers,
                "events_topic": events_topic,
                "samples_topic": samples_topic,
                "dlq_topic": dlq_topic,
            },
            store={"url": redis_url},
            consumer={
                "group_id": group_id,
                "negatives": negatives,
                "stop_when_idle_s": stop_when_idle,
                "metrics_port": metrics_port,
            },
        )
        ensure_topics(cfg.kafka)
        with ConsumerMetrics() as metrics:
            status = ConsumerStatus()
            runner = make_runner(runner_name, cfg, batch_handler(metrics, status))
            metrics.track_partitions(lambda: len(runner.assigned()))
            serve_metrics(metrics, cfg)
            tune_for_batches()
            with live_status(status):
                stats = runner.run(stop_on_signals())
        console.print(
            f"consumed {stats.events} events: {stats.samples} samples, {stats.dead} dead letters"
        )


@app.command("rebuild")
def rebuild(
    bootstrap_servers: str | None = setting("kafka.bootstrap_servers"),
    events_topic: str | None = setting("kafka.events_topic"),
    redis_url: str | None = setting("store.url"),
    group_id: str | None = setting("consumer.group_id"),
    force: bool = typer.Option(False, help="Rebuild even a store that is intact"),
    log_level: str | None = LogLevel,
    config_file: Path | None = ConfigFile,
) -> None:
    """Rebuild a feature store that lost its data, or partitions' state, from the events topic.

    Emits nothing. Stop the consumers first; start them again afterwards.
    """
    from streamrec.consumers.rebuild import rebuild_store
    from streamrec.kafka.clients import require_broker

    with cli_errors():
        cfg = build_config(
            log_level=log_level,
            config_file=config_file,
            kafka={"bootstrap_servers": bootstrap_servers, "events_topic": events_topic},
            store={"url": redis_url},
            consumer={"group_id": group_id},
        )
        require_broker(cfg.kafka)  # one line at once if none answers; it reads one topic, creates none
        stats = rebuild_store(cfg, force=force)
        console.print(
            f"rebuilt the feature store from {stats.events} events in {stats.seconds:.1f} s "
            f"({stats.invalid} invalid records skipped); start the consumers again"
        )
