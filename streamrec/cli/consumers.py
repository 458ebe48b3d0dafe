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
    err_console,
    live_status,
    print_json,
    stop_on_signals,
)
from streamrec.cli.options import ConfigFile, LogLevel, consumer_runner, json_output, path_given, setting
from streamrec.wording import plural

if TYPE_CHECKING:  # the Kafka and Redis clients: imported when a command runs, not for --help
    from streamrec.config import StreamrecConfig
    from streamrec.consumers.native_runner import BatchReport, ConsumerStats
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
    """Serve ``/metrics`` on the configured interface and port, with the group's lag on the events topic
    (a client of the metrics' own asks the broker at each scrape); nothing when off.
    """
    from streamrec.observability import LagProbe, lag_client

    if metrics.serve(cfg.consumer.metrics_port, cfg.consumer.metrics_host) is None:
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
        console.print(consumed_line(stats))


def consumed_line(stats: ConsumerStats) -> str:
    """A run's last line: what it consumed and made, and the duplicates it made nothing of."""
    line = (
        f"consumed {plural(stats.events, 'event')}: {plural(stats.samples, 'sample')}, "
        f"{plural(stats.dead, 'dead letter')}"
    )
    if stats.duplicates:  # a file published again: without this, "0 samples" said nothing of why
        line += f", {plural(stats.duplicates, 'duplicate')} (event ids processed before: no samples)"
    return line


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
            f"rebuilt the feature store from {plural(stats.events, 'event')} in {stats.seconds:.1f} s "
            f"({plural(stats.invalid, 'invalid record')} skipped); start the consumers again"
        )


# The default of --idle: `streamrec.deadletter_reader.IDLE_S` (written here so that --help
# imports no Kafka client; tests/unit/cli/test_dead_letters.py checks they agree).
_IDLE_S = 5.0


@app.command("dead-letters")
def dead_letters(
    samples: bool = typer.Option(
        False, "--samples", help="Read the learner's dead-letter topic (bad samples), not the consumers'"
    ),
    since: str | None = typer.Option(
        None, "--since", metavar="<time>", show_default="the start",
        help="Only dead letters of records stamped at or after this: a time ago (30m, 2h, 1d) or an "
        "ISO 8601 time (a dead letter keeps its record's timestamp)",
    ),
    limit: int | None = typer.Option(
        None, "--limit", show_default="all", help="Only the last N dead letters written"
    ),
    kinds: list[str] = typer.Option(  # noqa: B008  # typer's way of declaring an option
        [], "--kind", metavar="<kind>", show_default="every kind",
        help="Only dead letters of this kind of reason (repeat for more): the `reason` label of "
        "streamrec_consumer_dead_letters_total, such as not_json or wrong_partition",
    ),
    write: Path | None = typer.Option(
        None, "--write", metavar="<path>", parser=path_given, show_default="no file",
        help="Write their values there, one a line (JSONL where they are JSON), to fix and publish "
        "again with `streamrec produce FILE`; what cannot be written is counted",
    ),
    examples: int = typer.Option(3, "--examples", min=0, help="Examples shown of each kind of reason"),
    idle: float = typer.Option(
        _IDLE_S, "--idle", help="Stop after this many seconds without a record, even short of the end"
    ),
    bootstrap_servers: str | None = setting("kafka.bootstrap_servers"),
    dlq_topic: str | None = setting("kafka.dlq_topic"),
    samples_dlq_topic: str | None = setting("kafka.samples_dlq_topic"),
    as_json: bool = json_output(),
    log_level: str | None = LogLevel,
    config_file: Path | None = ConfigFile,
) -> None:
    """Count a dead-letter topic's records by kind of reason, with examples; --write saves their
    values to fix and publish again.

    Reads the topic up to its end as of the start, assigned its partitions: it joins no
    consumer group and commits nothing, so it never disturbs the consumers or the learner.
    """
    from datetime import UTC, datetime

    from streamrec.deadletter_reader import Reading, survey
    from streamrec.deadletter_summary import since_ms

    with cli_errors():
        cfg = build_config(
            quiet=True,
            log_level=log_level,
            config_file=config_file,
            kafka={
                "bootstrap_servers": bootstrap_servers,
                "dlq_topic": dlq_topic,
                "samples_dlq_topic": samples_dlq_topic,
            },
        )
        reading = Reading(
            cfg.kafka.samples_dlq_topic if samples else cfg.kafka.dlq_topic,
            since_ms=None if since is None else since_ms(since, datetime.now(UTC)),
            limit=limit,
            idle_s=idle,
            kinds=frozenset(kinds),
        )
        found = survey(cfg.kafka, reading, write, examples)
        short = {str(p): {"position": at, "end": end} for p, (at, end) in found.short.items()}
        if as_json:
            doc = found.summary.doc() | {"stopped_short": short}
            if found.values is not None:
                doc |= {"written": found.values.written, "left_out": dict(found.values.skipped)}
            print_json(doc)
            return
        for line in found.summary.lines():
            console.print(line, highlight=False, markup=False)
        if found.values is not None and write is not None:
            console.print(found.values.line(write), highlight=False, markup=False)
        if short:
            where = ", ".join(f"{p} ({s['position']} of {s['end']})" for p, s in short.items())
            err_console.print(
                f"[yellow]warning:[/yellow] stopped after {idle:g} s without a record, short of the end "
                f"of partitions {where}",
                highlight=False,
            )
