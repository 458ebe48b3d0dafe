"""What every CLI command shares: config from flags, error mapping, the console."""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import typer
from rich.console import Console, RenderableType
from rich.markup import escape
from typer.core import TyperGroup

from streamrec import logs
from streamrec.errors import LearnerFailed, StreamrecError

if TYPE_CHECKING:  # pydantic: imported when a command runs, not for --help
    from streamrec.config import StreamrecConfig
    from streamrec.learner.reports import MicroBatchReport

# Long lines stay whole; piped output (logs, CI) gets room for tables instead of 80 columns.
# No emoji codes: a class path such as "boom:Boom:" in a message is printed as written, not as 💥.
console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160, emoji=False)
err_console = Console(stderr=True, soft_wrap=True, emoji=False)


def command_group(help: str, **options: Any) -> typer.Typer:
    """A group of commands (``options`` as `typer.Typer` takes them), its help written
    as the docstrings are: paragraphs wrapped in the source and reflowed to the terminal
    (Markdown; Typer's default keeps every line break of the source), backticks for code.
    A command line the parser refuses is one ``error:`` line, as a command's own refusal is
    (`cli_errors`), not Typer's box titled ``Error``.
    """
    return typer.Typer(
        help=help, no_args_is_help=True, rich_markup_mode="markdown", cls=_Commands, **options
    )


# The parser's refusals: the base of the one Typer exports (its own click's UsageError, which a
# separately installed click's is not).
_UsageError: type[Exception] = typer.BadParameter.__mro__[1]


class _Commands(TyperGroup):
    """Typer's group, its parse errors (this group's and its commands') said as `cli_errors` says ours."""

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        path = " ".join(filter(None, [parent.command_path if parent is not None else "", info_name or ""]))
        with _usage_errors(lambda: path):
            return super().make_context(info_name, args, parent, **extra)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        name, command, rest = super().resolve_command(ctx, args)
        ctx.meta[_INVOKED] = f"{ctx.command_path} {name}"  # the help to offer if its flags are refused
        return name, command, rest

    def invoke(self, ctx: Any) -> Any:
        with _usage_errors(lambda: ctx.meta.get(_INVOKED, ctx.command_path)):
            return super().invoke(ctx)


_INVOKED = "streamrec.invoked"


@contextmanager
def _usage_errors(command_path: Callable[[], str]) -> Iterator[None]:
    """A refused command line as ``error: <why>``, the usage and how to get help; exit status 2.

    ``command_path``: the command whose help to offer when the error names no context (a
    missing option value is found before the context is made).
    """
    try:
        yield
    except _UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # no arguments: the help, as Typer shows it
            raise
        message = exc.format_message().strip().rstrip(".")  # type: ignore[attr-defined]  # a UsageError's
        err_console.print(f"[red]error:[/red] {escape(message)}", highlight=False)
        ctx = getattr(exc, "ctx", None)
        if ctx is not None:
            err_console.print(escape(ctx.get_usage()), highlight=False, style="dim")
        path = ctx.command_path if ctx is not None else command_path()
        err_console.print(f"Try '{escape(path)} --help' for help.", highlight=False, style="dim")
        raise typer.Exit(2) from None


# The status line shows whole seconds (freshness, rates): redrawing once a second is enough.
_STATUS_REFRESH_PER_S = 1.0


def build_config(
    quiet: bool = False,
    log_level: str | None = None,
    config_file: Path | None = None,
    **sections: dict[str, Any],
) -> StreamrecConfig:
    """Config from env/TOML (``config_file``, else ``./streamrec.toml``) with the flags that
    were given (``None`` = not given) on top.

    ``quiet`` shows only warnings unless ``--log-level`` or ``STREAMREC_LOG_LEVEL`` asks for
    more: for commands whose console output already tells the story.
    """
    from streamrec.cli.options import NULL
    from streamrec.config.loading import load_settings

    given: dict[str, Any] = {  # a flag given null unsets its setting
        name: {k: None if v is NULL else v for k, v in values.items() if v is not None}
        for name, values in sections.items()
    }
    if log_level is not None:
        given["log_level"] = log_level
    overrides = {name: values for name, values in given.items() if values}
    cfg = load_settings(config_file, overrides, by="its flag")
    quiet = quiet and log_level is None and "STREAMREC_LOG_LEVEL" not in os.environ
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
        if isinstance(exc, LearnerFailed) and exc.frames:  # a user's learner: their code, their frames
            err_console.print(escape(exc.frames.rstrip()), highlight=False)
        raise typer.Exit(1) from None
    except KeyboardInterrupt as exc:  # its notes: what it left done (a publish's deliveries)
        err_console.print(escape(": ".join(["interrupted", *getattr(exc, "__notes__", ())])), highlight=False)
        raise typer.Exit(130) from None


def stop_on_signals(*, restart_calls: bool = False) -> threading.Event:
    """An event set by SIGINT/SIGTERM, so a loop can finish its batch and exit cleanly; a
    second signal interrupts at once (the uncommitted batch is aborted and redone at the next
    start), whatever the process is waiting for but a call into librdkafka, which runs the
    handler once it returns (a transaction's after about 30 s, docs/operating/faults.md).

    ``restart_calls``: a blocking call the signal interrupts resumes (SA_RESTART) instead of
    failing with EINTR; the handler runs once it returns. A learner rank's: Paddle's TCP store
    fails a read so interrupted, and a rank stopped while it waited there for the others
    (`streamrec.learner.ranks.RankGroup.meet`) left the group, failing the others' exchange.
    Waits the kernel never restarts (sleeps, polls, locks) still run the handler at once.
    """
    stop = threading.Event()

    def handler(signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if stop.is_set():
            err_console.print(f"signal {name} again: stopping now")
            raise KeyboardInterrupt
        err_console.print(f"signal {name}: finishing the current batch (send it again to stop at once)")
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, handler)
        if restart_calls:
            signal.siginterrupt(signum, False)  # after signal(), which sets the handler's flags
    return stop


@contextmanager
def live_status(status: RenderableType) -> Iterator[None]:
    """On a terminal, keep ``status`` as one line under the output, redrawn in place.

    ``status`` renders its current state at each redraw (give it a ``__rich__`` method), so
    figures that move with the clock, such as freshness, tick between updates. Printed lines
    and logs scroll above it. When stdout is not a terminal this does nothing: the command
    prints its one line per item instead (check ``console.is_terminal``).
    """
    if not console.is_terminal:
        yield
        return
    from rich.live import Live

    with Live(status, console=console, refresh_per_second=_STATUS_REFRESH_PER_S, redirect_stderr=True):
        yield


def print_json(doc: object) -> None:
    """``doc`` as indented JSON on standard output (a command's ``--json``)."""
    typer.echo(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode())


def format_duration(seconds: float) -> str:
    """A duration for a status line: ``42s``, ``17m``, ``5.2h``, ``12d``; ``-`` when unknown."""
    if math.isnan(seconds):  # nothing measured yet
        return "-"
    # Each unit until the figure reaches two of the next one, so it never reads "1m" for 119 s.
    if abs(seconds) < 120:
        return f"{seconds:.0f}s"
    if abs(seconds) < 7200:
        return f"{seconds / 60:.0f}m"
    if abs(seconds) < 172_800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86_400:.0f}d"


def print_report(report: MicroBatchReport) -> None:
    """One line per micro-batch: progressive metrics, scored before training; then what was
    dead-lettered and how many steps were skipped as not finite, when any were.
    """
    m = report.metrics
    problems = ""
    if report.dead:
        problems += f"  dead-lettered {report.dead}"
    if report.skipped_steps:
        problems += f"  skipped {report.skipped_steps}/{report.steps} non-finite steps"
    figures = (
        f"AUC {m.auc:.4f}  GAUC {m.gauc:.4f}  known-target AUC {m.known_auc:.4f} "
        f"(n={m.known_samples})  logloss {m.logloss:.4f}"
        if report.judged
        else f"too small to judge ({m.samples} samples < STREAMREC_LEARNER__MIN_EVAL_SAMPLES "
        f"{report.min_eval_samples})"
    )
    console.print(
        f"micro-batch {report.index:>4}  samples {m.samples:>6}  {figures}  "
        f"trained in {report.train_seconds:.2f}s{problems}",
        highlight=False,
    )
