"""What every CLI command shares: config from flags, error mapping, the console."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from streamrec import logs
from streamrec.config import StreamrecConfig, load_config
from streamrec.errors import StreamrecError

# Long lines stay whole; piped output (logs, CI) gets room for tables instead of 80 columns.
console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, soft_wrap=True)


def build_config(quiet: bool = False, **sections: dict[str, Any]) -> StreamrecConfig:
    """Config from env/TOML with the flags that were given (``None`` = not given) on top.

    ``quiet`` shows only warnings unless ``STREAMREC_LOG_LEVEL`` asks for more: for commands
    whose console output already tells the story.
    """
    given = {name: {k: v for k, v in values.items() if v is not None} for name, values in sections.items()}
    cfg = load_config(**{name: values for name, values in given.items() if values})
    quiet = quiet and "STREAMREC_LOG_LEVEL" not in os.environ
    logs.configure("WARNING" if quiet else cfg.log_level)
    return cfg


@contextmanager
def cli_errors() -> Iterator[None]:
    """Turn a StreamrecError into one red line on stderr and exit status 1."""
    try:
        yield
    except StreamrecError as exc:
        first, *rest = str(exc).splitlines() or [""]
        err_console.print(f"[red]error:[/red] {escape(first)}", highlight=False)
        for line in rest:  # e.g. the log tail of a service that failed to start
            err_console.print(escape(line), highlight=False, style="dim")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        err_console.print("interrupted")
        raise typer.Exit(130) from None


def stop_on_signals() -> threading.Event:
    """An event set by SIGINT/SIGTERM, so a loop can finish its batch and exit cleanly."""
    stop = threading.Event()

    def handler(signum: int, frame: object) -> None:
        err_console.print(f"signal {signal.Signals(signum).name}: finishing the current batch")
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return stop
