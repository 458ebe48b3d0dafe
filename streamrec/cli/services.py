"""``streamrec up | down | status``: the local broker and Redis for development."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from streamrec.cli.common import build_config, cli_errors
from streamrec.cli.common import console as _out
from streamrec.cli.options import ConfigFile, LogLevel, setting

if TYPE_CHECKING:  # the Kafka and Redis clients, pydantic: imported when a command runs
    from streamrec.config import ServicesConfig
    from streamrec.local.services import ServiceStatus


def _config(
    host: str | None,
    kafka_port: int | None,
    redis_port: int | None,
    state_dir: Path | None,
    log_level: str | None,
    config_file: Path | None,
    data_dir: Path | None = None,
) -> ServicesConfig:
    given = {
        "host": host,
        "kafka_port": kafka_port,
        "redis_port": redis_port,
        "state_dir": state_dir,
        "data_dir": data_dir,
    }
    return build_config(log_level=log_level, config_file=config_file, services=given).services


def _table(rows: Sequence[ServiceStatus]) -> Table:
    table = Table("service", "address", "pid", "state")
    colour = {"started": "green", "running": "green", "stopped": "dim"}
    for row in rows:
        state = f"[{colour.get(row.state, 'yellow')}]{row.state}[/]"
        table.add_row(row.name, row.address, "-" if row.pid is None else str(row.pid), state)
    return table


def up(
    host: str | None = setting("services.host"),
    kafka_port: int | None = setting("services.kafka_port"),
    redis_port: int | None = setting("services.redis_port"),
    state_dir: Path | None = setting("services.state_dir"),
    data_dir: Path | None = setting("services.data_dir"),
    log_level: str | None = LogLevel,
    config_file: Path | None = ConfigFile,
) -> None:
    """Start the local Kafka broker and Redis in the background.

    The broker keeps nothing once stopped; Redis keeps nothing either unless --data-dir.
    """
    from streamrec.local import services

    with cli_errors():
        cfg = _config(host, kafka_port, redis_port, state_dir, log_level, config_file, data_dir)
        given = [name for name, port in (("kafka", kafka_port), ("redis", redis_port)) if port is not None]
        rows = services.up(cfg, given)  # a port asked for, by flag or variable, must be where it runs
        _out.print(_table(rows))
        kept = next(row.data_dir for row in rows if row.name == "redis")  # as it runs
        keeps = f"in {kept} (append-only file)" if kept else "nothing (no --data-dir)"
        _out.print(f"Redis keeps {keeps}; the broker keeps nothing once stopped.")


def down(
    host: str | None = setting("services.host"),
    kafka_port: int | None = setting("services.kafka_port"),
    redis_port: int | None = setting("services.redis_port"),
    state_dir: Path | None = setting("services.state_dir"),
    log_level: str | None = LogLevel,
    config_file: Path | None = ConfigFile,
) -> None:
    """Stop the services that ``streamrec up`` started."""
    from streamrec.local import services

    with cli_errors():
        cfg = _config(host, kafka_port, redis_port, state_dir, log_level, config_file)
        _out.print(_table(services.down(cfg)))


def status(
    host: str | None = setting("services.host"),
    kafka_port: int | None = setting("services.kafka_port"),
    redis_port: int | None = setting("services.redis_port"),
    state_dir: Path | None = setting("services.state_dir"),
    log_level: str | None = LogLevel,
    config_file: Path | None = ConfigFile,
) -> None:
    """Show whether the local Kafka broker and Redis are running."""
    from streamrec.local import services

    with cli_errors():
        cfg = _config(host, kafka_port, redis_port, state_dir, log_level, config_file)
        _out.print(_table(services.status(cfg)))


def register(app: typer.Typer) -> None:
    """Add ``up``, ``down`` and ``status`` to the CLI root."""
    app.command("up")(up)
    app.command("down")(down)
    app.command("status")(status)
