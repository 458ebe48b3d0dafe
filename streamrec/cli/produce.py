"""``streamrec produce FILE``: publish a dataset as contract events."""

from __future__ import annotations

from pathlib import Path

import typer

from streamrec.cli.common import build_config, cli_errors, console
from streamrec.cli.options import (
    FORMATS,
    ConfigFile,
    LogLevel,
    alias,
    dataset_format,
    dataset_limit,
    given,
    setting,
)
from streamrec.errors import ConfigError
from streamrec.wording import plural


def produce(
    source: str = typer.Argument(
        ...,
        help="Taobao CSV, MovieLens ratings.csv/dir, ML-100K u.data, JSONL, or "
        "synthetic[:events=N,users=N,seed=N,...] (the click generator)",
    ),
    fmt: str = dataset_format(),
    rate: float = typer.Option(0.0, help="Events per second; 0 = as fast as possible"),
    limit: int | None = dataset_limit(),
    positive_rating: float | None = typer.Option(
        None, help="MovieLens and ML-100K: ratings >= this are label 1", show_default="4"
    ),
    bootstrap_servers: str | None = setting("kafka.bootstrap_servers"),
    events_topic: str | None = setting("kafka.events_topic"),
    topic: str | None = alias("kafka.events_topic", "--topic"),
    log_level: str | None = LogLevel,
    config_file: Path | None = ConfigFile,
) -> None:
    """Publish a dataset to the events topic in event-time order, keyed by user."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from streamrec.datasets import load_events
    from streamrec.datasets.sources import positive_rating_for
    from streamrec.kafka.topics import ensure_topics
    from streamrec.producer import publish

    with cli_errors():
        if not rate >= 0:  # nan too
            raise ConfigError(f"--rate must be events per second, 0 or more (0: at once), not {rate}")
        if fmt not in FORMATS:
            raise ConfigError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
        cfg = build_config(
            log_level=log_level,
            config_file=config_file,
            kafka={"bootstrap_servers": bootstrap_servers, "events_topic": given(events_topic, topic)}
        )
        # the declared features (STREAMREC_FEATURES) travel as the events' top-level fields
        schema = cfg.feature_schema()
        threshold = positive_rating_for(source, fmt, positive_rating)
        events = load_events(
            source, fmt, positive_rating=threshold, limit=limit, schema=schema, to_replay=True
        )
        ensure_topics(cfg.kafka)
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
        with Progress(*columns, console=console, transient=False) as progress:
            task = progress.add_task(f"publishing to {cfg.kafka.events_topic}", total=len(events))
            sent = publish(
                events, cfg.kafka, rate=rate, on_progress=lambda n: progress.advance(task, n),
                schema=cfg.feature_schema(),
            )
        console.print(f"published {plural(sent, 'event')} to {cfg.kafka.events_topic}")
