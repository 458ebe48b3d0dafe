"""``streamrec up | down | status``: the local broker and Redis for development."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from streamrec.cli.common import build_config, cli_errors
from streamrec.cli.common import console as _out
from streamrec.config import ServicesConfig
from streamrec.local import services

Host = Annotated[
    str | None, typer.Option("--host", help="Listen address [STREAMREC_SERVICES__HOST]")
]
KafkaPort = Annotated[
    int | None, typer.Option("--kafka-port", help="Broker port [STREAMREC_SERVICES__KAFKA_PORT]")
]
RedisPort = Annotated[
    int | None, typer.Option("--redis-port", help="Redis port [STREAMREC_SERVICES__REDIS_PORT]")
]
StateDir = Annotated[
    Path | None,
    typer.Option("--state-dir", help="Pid and log files [STREAMREC_SERVICES__STATE_DIR]"),
]


def _config(
    host: str | None,
    kafka_port: int | None,
    redis_port: int | None,
    state_dir: Path | None,
    data_dir: Path | None = None,
) -> ServicesConfig:
    given = {
        "host": host,
        "kafka_port": kafka_port,
        "redis_port": redis_port,
        "state_dir": state_dir,
        "data_dir": data_dir,
    }
    return build_config(services=given).services


def _table(rows: Sequence[services.ServiceStatus]) -> Table:
    table = Table("service", "address", "pid", "state")
    colour = {"started": "green", "running": "green", "stopped": "dim"}
    for row in rows:
        state = f"[{colour.get(row.state, 'yellow')}]{row.state}[/]"
        table.add_row(row.name, row.address, "-" if row.pid is None else str(row.pid), state)
    return table


def up(
    host: Host = None,
    kafka_port: KafkaPort = None,
    redis_port: RedisPort = None,
    state_dir: StateDir = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            help="Keep Redis's data here (append-only file) across restarts "
            "[STREAMREC_SERVICES__DATA_DIR]",
        ),
    ] = None,
) -> None:
    """Start the local Kafka broker and Redis in the background.

    The broker keeps nothing once stopped; Redis keeps nothing either unless --data-dir.
    """
    with cli_errors():
        cfg = _config(host, kafka_port, redis_port, state_dir, data_dir)
        _out.print(_table(services.up(cfg)))
        kept = f"in {cfg.data_dir} (append-only file)" if cfg.data_dir else "nothing (no --data-dir)"
        _out.print(f"Redis keeps {kept}; the broker keeps nothing once stopped.")


def down(
    host: Host = None,
    kafka_port: KafkaPort = None,
    redis_port: RedisPort = None,
    state_dir: StateDir = None,
) -> None:
    """Stop the services that ``streamrec up`` started."""
    with cli_errors():
        cfg = _config(host, kafka_port, redis_port, state_dir)
        services.down(cfg)
        _out.print(_table(services.status(cfg)))


def status(
    host: Host = None,
    kafka_port: KafkaPort = None,
    redis_port: RedisPort = None,
    state_dir: StateDir = None,
) -> None:
    """Show whether the local Kafka broker and Redis are running."""
    with cli_errors():
        _out.print(_table(services.status(_config(host, kafka_port, redis_port, state_dir))))


def register(app: typer.Typer) -> None:
    """Add ``up``, ``down`` and ``status`` to the CLI root."""
    app.command("up")(up)
    app.command("down")(down)
    app.command("status")(status)
