"""``streamrec learner run``: the micro-batch DIN learner process."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from streamrec.cli.common import build_config, cli_errors, console, stop_on_signals
from streamrec.kafka.topics import ensure_topics

if TYPE_CHECKING:  # the learner imports Paddle (about a second): only when a command needs it
    from streamrec.learner.runner import MicroBatchReport

app = typer.Typer(help="Train DIN incrementally on the samples stream.", no_args_is_help=True)


def print_report(report: MicroBatchReport) -> None:
    """One line per micro-batch: progressive metrics, scored before training; then what was
    dead-lettered and how many steps were skipped as not finite, when any were."""
    m = report.metrics
    problems = ""
    if report.dead:
        problems += f"  dead-lettered {report.dead}"
    if report.skipped_steps:
        problems += f"  skipped {report.skipped_steps}/{report.steps} non-finite steps"
    console.print(
        f"micro-batch {report.index:>4}  samples {m.samples:>6}  AUC {m.auc:.4f}  "
        f"GAUC {m.gauc:.4f}  known-target AUC {m.known_auc:.4f} (n={m.known_samples})  "
        f"logloss {m.logloss:.4f}  trained in {report.train_seconds:.2f}s{problems}",
        highlight=False,
    )


@app.command("run")
def run(
    interval: float | None = typer.Option(None, help="Seconds per micro-batch (default 180)"),
    max_batch: int | None = typer.Option(None, help="Cap on samples per micro-batch"),
    snapshot_dir: Path | None = typer.Option(None, help="Where snapshots are written"),
    snapshot_every: int | None = typer.Option(None, help="Snapshot after this many micro-batches"),
    stop_when_idle: float | None = typer.Option(
        None, help="Stop (after a final snapshot) when no sample arrives for this many seconds"
    ),
    device: str | None = typer.Option(None, help="auto, cpu or gpu[:N]"),
    bootstrap_servers: str | None = typer.Option(None, help="Kafka bootstrap servers"),
) -> None:
    """Score then train each micro-batch; snapshot every N micro-batches and on request."""
    from streamrec.learner.din import DINLearner
    from streamrec.learner.runner import LearnerRunner
    from streamrec.learner.snapshot import SnapshotStore

    with cli_errors():
        cfg = build_config(
            kafka={"bootstrap_servers": bootstrap_servers},
            model={"device": device},
            learner={
                "interval_s": interval,
                "max_batch_samples": max_batch,
                "snapshot_dir": snapshot_dir,
                "snapshot_every": snapshot_every,
                "stop_when_idle_s": stop_when_idle,
            },
        )
        ensure_topics(cfg.kafka)
        store = SnapshotStore(cfg.learner.snapshot_dir)
        with LearnerRunner(  # refuses a snapshot directory another learner holds
            cfg,
            DINLearner(cfg.model),
            on_report=print_report,
            on_snapshot=lambda m: console.print(f"snapshot {m.name} written: {store.path(m.version)}"),
            snapshots=store,
        ) as runner:
            stats = runner.run(stop_on_signals())
        console.print(
            f"trained {stats.micro_batches} micro-batches, {stats.samples_trained} samples; "
            f"dead-lettered {stats.dead} samples to {cfg.kafka.samples_dlq_topic}; "
            f"{stats.bad_batches} bad micro-batches ({stats.skipped_steps} steps skipped)"
        )
