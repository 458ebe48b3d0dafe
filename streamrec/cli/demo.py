"""``streamrec demo``: the whole flow end to end on the embedded broker and Redis."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from streamrec.cli.common import build_config, cli_errors, console, print_report, stop_on_signals
from streamrec.cli.options import (
    ConfigFile,
    LogLevel,
    consumer_runner,
    dataset_format,
    dataset_limit,
    path_given,
    setting,
)
from streamrec.cli.snapshot_common import version_name
from streamrec.cli.snapshot_format import format_positions
from streamrec.errors import ConfigError
from streamrec.wording import plural

if TYPE_CHECKING:  # Paddle and the clients: the demo imports them when it runs, not for --help
    from streamrec.learner.reports import MicroBatchReport
    from streamrec.pipeline import PipelineResult
    from streamrec.snapshots.store import SnapshotStore

DEMO_DATA = "movielens-latest-small"


def _bundled_movielens() -> Path:
    return Path(str(resources.files("streamrec.demo_data").joinpath(DEMO_DATA)))


def demo(
    data: str | None = typer.Option(
        None,
        help="Dataset path or synthetic[:events=N,...]",
        show_default="the bundled MovieLens latest-small",
    ),
    fmt: str = dataset_format(),
    limit: int | None = dataset_limit(),
    # The demo's own micro-batches and snapshots, whatever the learner's settings say.
    max_batch: int = typer.Option(2500, help="Cap on samples per micro-batch (the demo's own)"),
    snapshot_dir: Path | None = typer.Option(
        None, help="The snapshot directory (the demo's own)", show_default="snapshots/demo-<time>",
        parser=path_given,
    ),
    snapshot_every: int = typer.Option(10, help="Snapshot after this many micro-batches (the demo's own)"),
    runner: str = consumer_runner(),
    device: str | None = setting("model.device"),
    log_level: str | None = LogLevel,
    config_file: Path | None = ConfigFile,
) -> None:
    """Start a local broker and Redis, replay a dataset through producer -> consumers ->
    learner, print progressive metrics per micro-batch and the snapshots written.
    """
    from streamrec.config import RedisStoreConfig
    from streamrec.datasets import load_events
    from streamrec.kernelsettings import prefer_vector_kernels
    from streamrec.learner.registry import check_setting
    from streamrec.local.launch import local_services
    from streamrec.loopsettings import before_training_loop
    from streamrec.pipeline import run_pipeline  # imports Paddle: only when the demo runs
    from streamrec.snapshots.store import SnapshotStore

    with cli_errors():
        before_training_loop()
        prefer_vector_kernels()
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        if limit is not None and limit < 1:  # a demo of nothing, as the backtest refuses
            raise ConfigError(f"--limit must be a positive number of events, not {limit}")
        base = build_config(
            quiet=True,
            log_level=log_level,
            config_file=config_file,
            model={"device": device},
            consumer={"stop_when_idle_s": 5.0},
            learner={
                # Micro-batches are cut by size here: the replay is faster than real time.
                "interval_s": 10.0,
                "max_batch_samples": max_batch,
                "stop_when_idle_s": 5.0,
                "snapshot_every": snapshot_every,
                "snapshot_dir": snapshot_dir or Path("snapshots") / f"demo-{stamp}",
            },
        )
        check_setting(base.model.learner)  # before starting the services
        if not base.learner.resume_on_new_topic:
            _refuse_earlier_snapshots(SnapshotStore(base.learner.snapshot_dir))
        events = load_events(data or _bundled_movielens(), fmt, limit=limit, to_replay=True)
        console.print(f"read {plural(len(events), 'event')} from {data or DEMO_DATA}")
        with local_services() as services:
            console.print(
                f"broker at {services.bootstrap_servers} (Tansu, in memory), "
                f"Redis at {services.redis_url} (no persistence)"
            )
            # The demo's store is the Redis it started, whatever the configuration names.
            store = base.store if isinstance(base.store, RedisStoreConfig) else RedisStoreConfig()
            cfg = base.model_copy(
                update={
                    "kafka": base.kafka.model_copy(
                        update={"bootstrap_servers": services.bootstrap_servers}
                    ),
                    "store": store.model_copy(update={"url": services.redis_url}),
                }
            )
            reports: list[MicroBatchReport] = []

            def report(r: MicroBatchReport) -> None:
                reports.append(r)
                print_report(r)

            result = run_pipeline(
                cfg,
                events,
                on_report=report,
                on_snapshot=lambda m: console.print(
                    f"[green]snapshot {m.name}[/green] written to "
                    f"{SnapshotStore(cfg.learner.snapshot_dir).path(m.version)} "
                    f"(positions {format_positions(m)})"
                ),
                stop=stop_on_signals(),
                runner=runner,
            )
        _summary(result, reports)


def _refuse_earlier_snapshots(store: SnapshotStore) -> None:
    """Refuse a snapshot directory an earlier run wrote: the demo's broker starts empty.

    Its snapshots' positions point at a samples topic that is gone; the learner would stop on it
    after the services started.

    Raises:
        ConfigError: the directory and its newest version.
    """
    if versions := store.versions():
        raise ConfigError(
            f"--snapshot-dir {store.root} already holds {version_name(versions[-1])} from an earlier "
            "run, whose samples went with that run's broker: name a new directory, or leave "
            "--snapshot-dir out for snapshots/demo-<time>"
        )


def _mean(pairs: list[tuple[float, int]]) -> str:
    """Sample-weighted mean of (metric, samples) pairs, NaN metrics left out."""
    finite = [(v, n) for v, n in pairs if not math.isnan(v)]
    total = sum(n for _, n in finite)
    return f"{sum(v * n for v, n in finite) / total:.4f}" if total else "-"


def _summary(result: PipelineResult, reports: list[MicroBatchReport]) -> None:
    table = Table("stage", "figure")
    table.add_row("events published", str(result.published))
    table.add_row("events consumed", str(result.consumer.events))
    table.add_row("samples emitted", str(result.consumer.samples))
    table.add_row("dead letters", str(result.consumer.dead))
    table.add_row("micro-batches trained", str(result.learner.micro_batches))
    table.add_row("samples trained", str(result.learner.samples_trained))
    judged = [r for r in reports if r.judged]
    if small := [r for r in reports if not r.judged]:
        table.add_row(
            "micro-batches too small to judge (left out below)",
            f"{len(small)} ({plural(sum(r.metrics.samples for r in small), 'sample')})",
        )
    later = judged[len(judged) // 4 :]  # past the cold start
    for label, name in (
        ("progressive AUC", "auc"),
        ("progressive GAUC", "gauc"),
        ("known-target AUC", "known_auc"),
        ("novelty AUC, sampler check (~0.5)", "novelty_auc"),
        ("target in history alone, sampler check (~0.5)", "tell_history_auc"),
        ("category share alone, sampler check (~0.5)", "tell_category_auc"),
    ):
        pairs = [(getattr(r.metrics, name), r.metrics.samples) for r in later]
        table.add_row(f"{label}, last 3/4 (sample-weighted)", _mean(pairs))
    if result.snapshots:
        table.add_row("latest snapshot", result.snapshots[-1].name)
    if result.served is not None:
        table.add_row("served (promoted through the gate)", f"v{result.served:06d}")
    console.print(table)
