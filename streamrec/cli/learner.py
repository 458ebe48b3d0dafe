"""``streamrec learner run``: the micro-batch DIN learner process."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.text import Text

from streamrec.cli.common import (
    build_config,
    cli_errors,
    command_group,
    console,
    format_duration,
    live_status,
    print_report,
    stop_on_signals,
)
from streamrec.cli.options import ConfigFile, LogLevel, setting
from streamrec.errors import ConfigError
from streamrec.wording import plural

if TYPE_CHECKING:  # Paddle, the Kafka client, pydantic: imported when a command runs, not for --help
    from streamrec.config import StreamrecConfig
    from streamrec.kafka.records import Partition
    from streamrec.learner.reports import LearnerStats, MicroBatchReport
    from streamrec.learner.runner import LearnerRunner
    from streamrec.observability import LearnerMetrics
    from streamrec.serving.gate import Promoter
    from streamrec.snapshots.store import SnapshotManifest, SnapshotStore

app = command_group("Train the model (the DIN by default) incrementally on the samples stream.")


class LearnerStatus:
    """The live status line: the last micro-batch, samples trained, and freshness read from
    the metrics at each redraw, so it keeps growing while no samples arrive.
    """

    def __init__(self, metrics: LearnerMetrics) -> None:
        """Show ``metrics``' freshness; nothing trained yet."""
        self._metrics = metrics
        self.last: MicroBatchReport | None = None
        self.samples = 0  # trained by this process

    def update(self, report: MicroBatchReport) -> None:
        """Take a trained micro-batch's report."""
        self.last = report
        self.samples += report.metrics.samples

    def line(self) -> str:
        """The status as plain text."""
        freshness = format_duration(self._metrics.freshness_seconds())
        if self.last is None:
            return "learner: waiting for samples"
        m = self.last.metrics
        return (
            f"micro-batch {self.last.index}  samples trained {self.samples:,}  AUC {m.auc:.4f}  "
            f"GAUC {m.gauc:.4f}  freshness {freshness}  trained in {self.last.train_seconds:.2f}s"
        )

    def __rich__(self) -> Text:
        """Rendered by the live display at each redraw."""
        return Text(self.line())


def trained(stats: LearnerStats, resumed: SnapshotManifest | None) -> str:
    """What this run trained, with the totals since the first snapshot when it ``resumed`` one.

    ``stats`` holds the totals, the snapshot's counts restored; ``resumed`` (its manifest) the
    counts it was written with.

    Examples:
        >>> from types import SimpleNamespace
        >>> from streamrec.learner.reports import LearnerStats
        >>> snapshot = SimpleNamespace(micro_batches=5, samples_trained=20_000)
        >>> trained(LearnerStats(micro_batches=7, samples_trained=23_000), snapshot)
        'trained 2 micro-batches, 3,000 samples (7 and 23,000 in all, with the snapshot resumed)'
        >>> trained(LearnerStats(micro_batches=2, samples_trained=3_000), None)
        'trained 2 micro-batches, 3,000 samples'
        >>> trained(LearnerStats(micro_batches=1, samples_trained=1), None)
        'trained 1 micro-batch, 1 sample'
    """
    before = (0, 0) if resumed is None else (resumed.micro_batches, resumed.samples_trained)
    batches, samples = stats.micro_batches - before[0], stats.samples_trained - before[1]
    line = (
        f"trained {batches:,} micro-batch{'' if batches == 1 else 'es'}, "
        f"{samples:,} sample{'' if samples == 1 else 's'}"
    )
    if resumed is not None:
        line += f" ({stats.micro_batches:,} and {stats.samples_trained:,} in all, with the snapshot resumed)"
    return line


def snapshot_bytes(path: Path) -> int | None:
    """Bytes of a snapshot version's files; ``None`` when they cannot be read."""
    try:
        return sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    except OSError:
        return None


def report_handler(metrics: LearnerMetrics, status: LearnerStatus) -> Callable[[MicroBatchReport], None]:
    """The runner's ``on_report``: metrics, the status line, and on a pipe one printed line."""

    def on_report(report: MicroBatchReport) -> None:
        metrics.observe_report(report)
        status.update(report)
        if not console.is_terminal:
            print_report(report)

    return on_report


def snapshot_handler(
    metrics: LearnerMetrics,
    store: SnapshotStore,
    then: Callable[[SnapshotManifest], None] | None = None,
) -> Callable[[SnapshotManifest], None]:
    """The runner's ``on_snapshot``: metrics and one printed line, then ``then`` (the export
    and promotion).
    """

    def on_snapshot(manifest: SnapshotManifest) -> None:
        path = store.path(manifest.version)
        metrics.observe_snapshot(manifest, snapshot_bytes(path))
        console.print(f"snapshot {manifest.name} written: {path}")
        if then is not None:
            then(manifest)

    return on_snapshot


def take_up_resumed(
    runner: LearnerRunner,
    promoter: Promoter,
    metrics: LearnerMetrics,
    store: SnapshotStore,
    serve: Callable[[Callable[[], Mapping[Partition, int]]], None],
) -> None:
    """Take up the snapshot ``runner`` resumed, if any, then ``serve`` its positions.

    The gate judges from the resumed version, and the metrics start from it (freshness and
    the snapshot's age known at once); ``serve`` (``/metrics``) gets a copy of the positions
    at each scrape, since the runner's thread moves them meanwhile.
    """
    manifest = runner.resumed
    promoter.resume(manifest)
    if manifest is not None:
        metrics.observe_resumed(manifest, snapshot_bytes(store.path(manifest.version)))
    serve(lambda: runner.positions.copy())


def serve_metrics(
    metrics: LearnerMetrics, cfg: StreamrecConfig, positions: Callable[[], Mapping[Partition, int]]
) -> None:
    """Serve ``/metrics`` on the configured interface and port, with the lag of the runner's ``positions``
    (a client of the metrics' own asks the broker at each scrape); nothing when off.
    """
    from streamrec.observability import LagProbe, lag_client

    if metrics.serve(cfg.learner.metrics_port, cfg.learner.metrics_host) is None:
        return
    client = lag_client(cfg.kafka, cfg.learner.group_id)
    metrics.track_lag(LagProbe(client, cfg.kafka.samples_topic, positions))


@app.command("run")
def run(
    bootstrap_servers: str | None = setting("kafka.bootstrap_servers"),
    samples_topic: str | None = setting("kafka.samples_topic"),
    samples_dlq_topic: str | None = setting("kafka.samples_dlq_topic"),
    group_id: str | None = setting("learner.group_id"),
    interval: float | None = setting("learner.interval_s"),
    part: float | None = setting("learner.part_s"),
    max_part: int | None = setting("learner.max_part_samples"),
    max_batch: int | None = setting("learner.max_batch_samples"),
    snapshot_dir: Path | None = setting("learner.snapshot_dir"),
    snapshot_every: int | None = setting("learner.snapshot_every"),
    stop_when_idle: float | None = setting("learner.stop_when_idle_s"),
    metrics_port: int | None = setting("learner.metrics_port"),
    device: str | None = setting("model.device"),
    log_level: str | None = LogLevel,
    config_file: Path | None = ConfigFile,
    workers: int = typer.Option(
        1, help="Learner ranks on this host (paddle.distributed.launch); ignored under launch"
    ),
) -> None:
    """Score then train each micro-batch; snapshot every N micro-batches and on request."""
    from streamrec.cli.ranks import launch_workers, launched, run_rank

    with cli_errors():
        if workers < 1:  # one line, as every setting out of range
            raise ConfigError(f"--workers must be at least 1, not {workers}")
    if workers > 1 and not launched():
        raise typer.Exit(launch_workers(workers))
    if launched():  # a rank: should its launcher be killed outright, stop with it
        from streamrec.orphans import end_with_parent

        end_with_parent(os.getppid())
    from streamrec.kafka.topics import ensure_topics
    from streamrec.kernelsettings import prefer_vector_kernels
    from streamrec.learner.registry import make_learner
    from streamrec.learner.runner import LearnerRunner
    from streamrec.loopsettings import before_training_loop
    from streamrec.observability import LearnerMetrics
    from streamrec.serving.gate import Promoter
    from streamrec.snapshots.store import SnapshotStore

    prefer_vector_kernels()  # before the learner's first matrix product (MKL reads it then)
    with cli_errors():
        cfg = build_config(
            log_level=log_level,
            config_file=config_file,
            kafka={
                "bootstrap_servers": bootstrap_servers,
                "samples_topic": samples_topic,
                "samples_dlq_topic": samples_dlq_topic,
            },
            model={"device": device},
            learner={
                "group_id": group_id,
                "interval_s": interval,
                "part_s": part,
                "max_part_samples": max_part,
                "max_batch_samples": max_batch,
                "snapshot_dir": snapshot_dir,
                "snapshot_every": snapshot_every,
                "stop_when_idle_s": stop_when_idle,
                "metrics_port": metrics_port,
            },
        )
        # A setting naming no learner fails before the broker.
        learner = make_learner(cfg.model, cfg.feature_schema())
        ensure_topics(cfg.kafka)
        store = SnapshotStore(cfg.learner.snapshot_dir, full_every=cfg.learner.full_snapshot_every)
        promoter = Promoter(store, cfg.learner)
        with LearnerMetrics() as metrics:
            on_snapshot = snapshot_handler(metrics, store, promoter.on_snapshot)
            serve = functools.partial(serve_metrics, metrics, cfg)  # /metrics, given the positions
            if launched():
                stats, resumed = run_rank(cfg, learner, store, promoter, metrics, on_snapshot, serve)
            else:
                status = LearnerStatus(metrics)
                with LearnerRunner(  # refuses a snapshot directory another learner holds
                    cfg,
                    learner,
                    on_report=report_handler(metrics, status),
                    on_snapshot=on_snapshot,
                    snapshots=store,
                    on_scored=promoter.on_scored,
                ) as runner:
                    take_up_resumed(runner, promoter, metrics, store, serve)
                    before_training_loop()
                    with live_status(status):
                        stats, resumed = runner.run(stop_on_signals()), runner.resumed
        console.print(
            f"{trained(stats, resumed)}; dead-lettered {plural(stats.dead, 'sample')} to "
            f"{cfg.kafka.samples_dlq_topic}; "
            f"{plural(stats.bad_batches, 'bad micro-batch', 'bad micro-batches')} "
            f"({plural(stats.skipped_steps, 'step')} skipped)"
        )
