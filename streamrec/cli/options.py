"""The options several commands share, each declared once, so that its name, help, env var
and default read the same on every command that offers it: the flags that set a setting,
and ``--config``, ``--format``, ``--limit``, ``--json`` and ``--runner``.

A flag overrides its ``STREAMREC_*`` setting for one run. Not given, the setting's env var
applies, then the ``--config`` file (``./streamrec.toml`` if there is one), then the
default shown. The env var is read by the
settings themselves (with ``null``, JSON and their one-line errors), not by the flag: the
flag only names it in its help.

The defaults are written here rather than read from `streamrec.config`, so that
``--help`` need not import the settings (pydantic-settings, a third of a second);
``tests/unit/cli/test_options.py`` checks each one against the settings model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from streamrec.errors import EMPTY_PATH


@dataclass(frozen=True)
class Flag:
    """A flag that sets the setting at ``path`` (``"kafka.bootstrap_servers"``)."""

    name: str
    path: str
    kind: type
    default: str  # as the settings model has it; "null" for none
    help: str

    @property
    def env(self) -> str:
        """The setting's env var: ``STREAMREC_KAFKA__BOOTSTRAP_SERVERS``."""
        return "STREAMREC_" + "__".join(part.upper() for part in self.path.split("."))


_FLAGS = (
    Flag("--log-level", "log_level", str, "INFO", "Log level of the `streamrec` logger"),
    Flag("--bootstrap-servers", "kafka.bootstrap_servers", str, "127.0.0.1:9092", "Kafka bootstrap servers"),
    Flag("--events-topic", "kafka.events_topic", str, "streamrec.events", "The events topic"),
    Flag("--dlq-topic", "kafka.dlq_topic", str, "streamrec.events.dlq", "The events' dead-letter topic"),
    Flag("--samples-topic", "kafka.samples_topic", str, "streamrec.samples", "The training samples topic"),
    Flag(
        "--samples-dlq-topic", "kafka.samples_dlq_topic", str, "streamrec.samples.dlq",
        "The samples' dead-letter topic (the learner's)",
    ),
    Flag("--redis-url", "store.url", str, "redis://127.0.0.1:6380/0", "Redis URL of the feature store"),
    Flag("--group-id", "consumer.group_id", str, "streamrec-consumers", "Consumer group"),
    Flag("--negatives", "consumer.negatives", int, "1", "Sampled negatives per implicit positive"),
    Flag(
        "--stop-when-idle", "consumer.stop_when_idle_s", float, "null",
        "Stop after this many seconds without events (null: never)",
    ),
    Flag("--metrics-port", "consumer.metrics_port", int, "9465", "Port of Prometheus /metrics (0: off)"),
    Flag("--group-id", "learner.group_id", str, "streamrec-learner", "Consumer group"),
    Flag("--interval", "learner.interval_s", float, "180.0", "Seconds per micro-batch"),
    Flag("--part", "learner.part_s", float, "20.0", "Seconds per part trained while gathering"),
    Flag("--max-part", "learner.max_part_samples", int, "20000", "Cap on samples per part"),
    Flag("--max-batch", "learner.max_batch_samples", int, "200000", "Cap on samples per micro-batch"),
    Flag("--snapshot-dir", "learner.snapshot_dir", Path, "snapshots", "The snapshot directory"),
    Flag("--snapshot-every", "learner.snapshot_every", int, "10", "Snapshot after this many micro-batches"),
    Flag("--keep", "learner.keep_snapshots", int, "10", "Versions to keep (0 keeps all)"),
    Flag(
        "--stop-when-idle", "learner.stop_when_idle_s", float, "null",
        "Stop (after a final snapshot) after this many seconds without samples (null: never)",
    ),
    Flag("--metrics-port", "learner.metrics_port", int, "9464", "Port of Prometheus /metrics (0: off)"),
    Flag("--device", "model.device", str, "auto", "auto, cpu or gpu[:N]"),
    Flag("--host", "serving.host", str, "127.0.0.1", "Interface to listen on"),
    Flag("--port", "serving.port", int, "8000", "Port to listen on"),
    Flag("--processes", "serving.processes", int, "1", "Server processes sharing the port (one per core)"),
    Flag(
        "--engine", "serving.engine", str, "auto",
        "What runs the model: onnx, paddle, or auto (onnx when the export has model.onnx)",
    ),
    Flag("--host", "services.host", str, "127.0.0.1", "Interface to listen on"),
    Flag("--kafka-port", "services.kafka_port", int, "9092", "Broker port"),
    Flag("--redis-port", "services.redis_port", int, "6380", "Redis port"),
    Flag("--state-dir", "services.state_dir", Path, ".streamrec", "Pid and log files"),
    Flag(
        "--data-dir", "services.data_dir", Path, "null",
        "Keep Redis's data here (append-only file) across restarts (null: keep nothing)",
    ),
)

#: Every settings flag, by the setting's path.
FLAGS: dict[str, Flag] = {flag.path: flag for flag in _FLAGS}

# Shown as Typer shows the type of a plain option.
_METAVARS: dict[type, str] = {str: "<str>", int: "<int>", float: "<float>", Path: "<path>"}


def path_given(text: str) -> Path:
    """A path option's or argument's value (``parser=path_given``), ``''`` refused.

    A `Path` reads ``''`` as ``.``, the working directory: ``--snapshot-dir ''`` (a variable
    unset in a script) listed the working directory as a snapshot directory.

    Raises:
        typer.BadParameter: it is empty (a usage error naming the option, as for other bad values).
    """
    if not text:
        raise typer.BadParameter(EMPTY_PATH)
    return Path(text)


def _as_given(text: str) -> str:
    # The value is converted in _only_given, once its source is known.
    return text


class _Null:
    """``null`` given to a flag whose setting may be unset (`NULL`)."""

    def __repr__(self) -> str:
        return "NULL"


#: What a flag gives for ``null`` on the command line, where its setting may be null (its
#: default is): `streamrec.cli.common.build_config` sets the setting to none, over env and file.
NULL: Any = _Null()


def _only_given(kind: type, nullable: bool = False) -> Any:
    """A callback: the flag's value converted to ``kind`` when given on the command line;
    ``None`` when it is the default or came from the env var (the settings read it). A
    ``nullable`` flag takes ``null`` too, as `NULL`.
    """

    def callback(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
        source = ctx.get_parameter_source(param.name or "")
        if value is None or source is None or source.name != "COMMANDLINE":
            return None
        if nullable and value == "null":
            return NULL
        try:
            return path_given(value) if kind is Path else kind(value)
        except ValueError:
            raise typer.BadParameter(f"{value!r} is not a valid {_METAVARS[kind].strip('<>')}") from None

    return callback


def setting(path: str) -> Any:
    """The option of the setting at ``path`` (an older spelling of its flag is an
    `alias` beside it).
    """
    flag = FLAGS[path]
    return typer.Option(
        flag.default,
        flag.name,
        help=flag.help,
        envvar=flag.env,
        show_envvar=True,
        show_default=True,
        metavar=_METAVARS[flag.kind],
        parser=_as_given,
        callback=_only_given(flag.kind, nullable=flag.default == "null"),
    )


#: The ``--log-level`` of every command that logs.
LogLevel: Any = setting("log_level")

#: The ``--config`` of every command that reads the settings.
ConfigFile: Any = typer.Option(
    None,
    "--config",
    help="TOML file of settings; env vars and flags override it",
    show_default="streamrec.toml, if there is one",
    metavar="<path>",
    parser=path_given,
)


def alias(path: str, name: str) -> Any:
    """A hidden option ``name``: an older spelling of the flag of the setting at ``path``."""
    kind, nullable = FLAGS[path].kind, FLAGS[path].default == "null"
    return typer.Option(
        None, name, hidden=True, metavar=_METAVARS[kind], parser=_as_given,
        callback=_only_given(kind, nullable),
    )


def given(*values: Any) -> Any:
    """The first value given (a flag and its older spellings), or ``None``."""
    return next((v for v in values if v is not None), None)


#: The dataset formats `streamrec.datasets.load_events` reads (``streamrec.datasets.FORMATS``,
#: which imports numpy; a test checks they are the same).
FORMATS = ("auto", "taobao", "movielens", "ml100k", "jsonl")


def dataset_format() -> Any:
    """The ``--format`` of a command that reads a dataset."""
    return typer.Option("auto", "--format", help=f"One of: {', '.join(FORMATS)}")


def dataset_limit() -> Any:
    """The ``--limit`` of a command that reads a dataset."""
    return typer.Option(None, help="Read only the earliest N events of the dataset", show_default="all")


def json_output() -> Any:
    """The ``--json`` of a command that prints a result."""
    return typer.Option(False, "--json", help="Print one JSON document instead of text")


def consumer_runner() -> Any:
    """The ``--runner`` of a command that runs the consumers."""
    return typer.Option(
        "native",
        "--runner",
        help="native: exactly-once (Kafka transactions); faust: a faust-streaming agent, at-least-once",
    )

