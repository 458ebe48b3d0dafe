"""``streamrec consumers run``: the event consumer process."""

from __future__ import annotations

import typer

from streamrec.cli.common import build_config, cli_errors, console, stop_on_signals
from streamrec.consumers.rebuild import rebuild_store
from streamrec.consumers.runner import ConsumerRunner
from streamrec.kafka.topics import ensure_topics

app = typer.Typer(help="Window events into Redis sequences and emit training samples.", no_args_is_help=True)


@app.command("run")
def run(
    bootstrap_servers: str | None = typer.Option(None, help="Kafka bootstrap servers"),
    redis_url: str | None = typer.Option(None, help="Redis URL of the feature store"),
    group_id: str | None = typer.Option(None, help="Consumer group"),
    negatives: int | None = typer.Option(None, help="Sampled negatives per implicit positive"),
    stop_when_idle: float | None = typer.Option(None, help="Stop after this many seconds without events"),
) -> None:
    """Consume events until interrupted (or idle for --stop-when-idle seconds)."""
    with cli_errors():
        cfg = build_config(
            kafka={"bootstrap_servers": bootstrap_servers},
            store={"url": redis_url},
            consumer={"group_id": group_id, "negatives": negatives, "stop_when_idle_s": stop_when_idle},
        )
        ensure_topics(cfg.kafka)
        stats = ConsumerRunner(cfg).run(stop_on_signals())
        console.print(
            f"consumed {stats.events} events: {stats.samples} samples, {stats.dead} dead letters"
        )


@app.command("rebuild")
def rebuild(
    bootstrap_servers: str | None = typer.Option(None, help="Kafka bootstrap servers"),
    redis_url: str | None = typer.Option(None, help="Redis URL of the feature store"),
    force: bool = typer.Option(False, help="Rebuild even a store that is intact"),
) -> None:
    """Rebuild a feature store that lost its data from the events topic, emitting nothing.

    Stop the consumers first; start them again afterwards.
    """
    with cli_errors():
        cfg = build_config(kafka={"bootstrap_servers": bootstrap_servers}, store={"url": redis_url})
        ensure_topics(cfg.kafka)
        stats = rebuild_store(cfg, force=force)
        console.print(
            f"rebuilt the feature store from {stats.events} events in {stats.seconds:.1f} s "
            f"({stats.invalid} invalid records skipped); start the consumers again"
        )
