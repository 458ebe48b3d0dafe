"""``streamrec demo``: the whole flow end to end on the embedded broker and Redis."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path

import typer
from rich.table import Table

from streamrec.cli.common import build_config, cli_errors, console, stop_on_signals
from streamrec.cli.learner import print_report
from streamrec.datasets import FORMATS, read_events
from streamrec.launch import local_services

DEMO_DATA = "movielens-latest-small"


def _bundled_movielens() -> Path:
    return Path(str(resources.files("streamrec.demo_data").joinpath(DEMO_DATA)))


def demo(
    data: Path | None = typer.Option(None, help="Dataset (default: the bundled MovieLens latest-small)"),
    fmt: str = typer.Option("auto", "--format", help=f"One of: {', '.join(FORMATS)}"),
    limit: int | None = typer.Option(None, help="Replay only the earliest N events"),
    max_batch: int = typer.Option(2500, help="Samples per micro-batch"),
    snapshot_dir: Path | None = typer.Option(None, help="Default: snapshots/demo-<time>"),
    snapshot_every: int = typer.Option(10, help="Snapshot after this many micro-batches"),
) -> None:
    """Start a local broker and Redis, replay a dataset through producer -> consumers ->
    learner, print progressive metrics per micro-batch and the snapshots written."""
    from streamrec.pipeline import run_pipeline  # imports Paddle: only when the demo runs

    with cli_errors():
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        events = read_events(data or _bundled_movielens(), fmt, limit=limit)
        console.print(f"read {len(events)} events from {data or DEMO_DATA}")
        with local_services() as services:
            console.print(
                f"broker at {services.bootstrap_servers} (Tansu, in memory), "
                f"Redis at {services.redis_url} (no persistence)"
            )
            cfg = build_config(
                quiet=True,
                kafka={"bootstrap_servers": services.bootstrap_servers},
                redis={"url": services.redis_url},
                consumer={"idle_exit_s": 5.0},
                learner={
                    # Micro-batches are cut by size here: the replay is faster than real time.
                    "interval_s": 10.0,
                    "max_batch_samples": max_batch,
                    "idle_exit_s": 5.0,
                    "snapshot_every": snapshot_every,
                    "snapshot_dir": snapshot_dir or Path("snapshots") / f"demo-{stamp}",
                },
            )
            result = run_pipeline(
                cfg,
                events,
                on_report=print_report,
                on_snapshot=lambda m: console.print(
                    f"[green]snapshot v{m.version:06d}[/green] written to "
                    f"{cfg.learner.snapshot_dir / f'v{m.version:06d}'} "
                    f"(offsets {', '.join(f'{o.partition}:{o.offset}' for o in m.offsets)})"
                ),
                stop=stop_on_signals(),
            )
        _summary(result)


def _summary(result) -> None:  # noqa: ANN001 - PipelineResult, kept out of the signature line
    table = Table("stage", "figure")
    table.add_row("events published", str(result.published))
    table.add_row("events consumed", str(result.consumer.events))
    table.add_row("samples emitted", str(result.consumer.samples))
    table.add_row("dead letters", str(result.consumer.dead))
    table.add_row("micro-batches trained", str(result.learner.micro_batches))
    table.add_row("samples trained", str(result.learner.samples_trained))
    last = result.learner.last_metrics
    for name in ("auc", "gauc", "known_auc", "logloss"):
        value = last.get(name)
        shown = "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.4f}"
        table.add_row(f"last micro-batch {name}", shown)
    if result.snapshots:
        table.add_row("latest snapshot", f"v{result.snapshots[-1].version:06d}")
    console.print(table)
