"""Flags that set a setting read the same on every command: one name per job, the env var
behind it and its default shown the same way, and the default the settings model's.

Measured before: defaults were shown three ways ("(default 180)" in the help, ``[default:
native]``, "default: the learner's") or not at all, only ``up``, ``down`` and ``status`` named
the env var (in their own ``[STREAMREC_...]`` style), ``--topic`` was only on ``produce``,
``--redis-url`` on ``consumers run`` but not on ``serve``/``score``, and ``learner run`` had
no ``--group-id``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.main import get_command
from typer.testing import CliRunner

from streamrec.cli import app
from streamrec.cli.generate import DEFAULTS as GENERATE_DEFAULTS
from streamrec.cli.options import FLAGS, FORMATS
from streamrec.config import StreamrecConfig, env_name

# Per command, every flag that sets a setting and its env var: the commands that use a
# setting offer its flag.
EXPECTED: dict[str, dict[str, str]] = {
    "produce": {
        "--bootstrap-servers": "STREAMREC_KAFKA__BOOTSTRAP_SERVERS",
        "--events-topic": "STREAMREC_KAFKA__EVENTS_TOPIC",
    },
    "replay publish": {
        "--bootstrap-servers": "STREAMREC_KAFKA__BOOTSTRAP_SERVERS",
        "--events-topic": "STREAMREC_KAFKA__EVENTS_TOPIC",
    },
    "replay backtest": {"--device": "STREAMREC_MODEL__DEVICE"},
    "consumers run": {
        "--bootstrap-servers": "STREAMREC_KAFKA__BOOTSTRAP_SERVERS",
        "--events-topic": "STREAMREC_KAFKA__EVENTS_TOPIC",
        "--samples-topic": "STREAMREC_KAFKA__SAMPLES_TOPIC",
        "--dlq-topic": "STREAMREC_KAFKA__DLQ_TOPIC",
        "--redis-url": "STREAMREC_STORE__URL",
        "--group-id": "STREAMREC_CONSUMER__GROUP_ID",
        "--negatives": "STREAMREC_CONSUMER__NEGATIVES",
        "--stop-when-idle": "STREAMREC_CONSUMER__STOP_WHEN_IDLE_S",
        "--metrics-port": "STREAMREC_CONSUMER__METRICS_PORT",
    },
    "consumers dead-letters": {
        "--bootstrap-servers": "STREAMREC_KAFKA__BOOTSTRAP_SERVERS",
        "--dlq-topic": "STREAMREC_KAFKA__DLQ_TOPIC",
        "--samples-dlq-topic": "STREAMREC_KAFKA__SAMPLES_DLQ_TOPIC",
    },
    "consumers rebuild": {
        "--bootstrap-servers": "STREAMREC_KAFKA__BOOTSTRAP_SERVERS",
        "--events-topic": "STREAMREC_KAFKA__EVENTS_TOPIC",
        "--redis-url": "STREAMREC_STORE__URL",
        "--group-id": "STREAMREC_CONSUMER__GROUP_ID",
    },
    "learner run": {
        "--bootstrap-servers": "STREAMREC_KAFKA__BOOTSTRAP_SERVERS",
        "--samples-topic": "STREAMREC_KAFKA__SAMPLES_TOPIC",
        "--samples-dlq-topic": "STREAMREC_KAFKA__SAMPLES_DLQ_TOPIC",
        "--group-id": "STREAMREC_LEARNER__GROUP_ID",
        "--interval": "STREAMREC_LEARNER__INTERVAL_S",
        "--part": "STREAMREC_LEARNER__PART_S",
        "--max-part": "STREAMREC_LEARNER__MAX_PART_SAMPLES",
        "--max-batch": "STREAMREC_LEARNER__MAX_BATCH_SAMPLES",
        "--snapshot-dir": "STREAMREC_LEARNER__SNAPSHOT_DIR",
        "--snapshot-every": "STREAMREC_LEARNER__SNAPSHOT_EVERY",
        "--stop-when-idle": "STREAMREC_LEARNER__STOP_WHEN_IDLE_S",
        "--metrics-port": "STREAMREC_LEARNER__METRICS_PORT",
        "--device": "STREAMREC_MODEL__DEVICE",
    },
    "score": {
        "--snapshot-dir": "STREAMREC_LEARNER__SNAPSHOT_DIR",
        "--redis-url": "STREAMREC_STORE__URL",
        "--engine": "STREAMREC_SERVING__ENGINE",
    },
    "serve": {
        "--snapshot-dir": "STREAMREC_LEARNER__SNAPSHOT_DIR",
        "--engine": "STREAMREC_SERVING__ENGINE",
        "--redis-url": "STREAMREC_STORE__URL",
        "--host": "STREAMREC_SERVING__HOST",
        "--port": "STREAMREC_SERVING__PORT",
        "--processes": "STREAMREC_SERVING__PROCESSES",
    },
    "demo": {"--device": "STREAMREC_MODEL__DEVICE"},
    **{
        f"snapshot {name}": {"--snapshot-dir": "STREAMREC_LEARNER__SNAPSHOT_DIR"}
        for name in ("create", "list", "show", "verify", "diff", "promote", "rollback", "export",
                     "materialize", "canary", "ab")
    },
    "snapshot prune": {
        "--snapshot-dir": "STREAMREC_LEARNER__SNAPSHOT_DIR",
        "--keep": "STREAMREC_LEARNER__KEEP_SNAPSHOTS",
    },
    **{
        name: {
            "--host": "STREAMREC_SERVICES__HOST",
            "--kafka-port": "STREAMREC_SERVICES__KAFKA_PORT",
            "--redis-port": "STREAMREC_SERVICES__REDIS_PORT",
            "--state-dir": "STREAMREC_SERVICES__STATE_DIR",
        }
        for name in ("down", "status")
    },
    "up": {
        "--host": "STREAMREC_SERVICES__HOST",
        "--kafka-port": "STREAMREC_SERVICES__KAFKA_PORT",
        "--redis-port": "STREAMREC_SERVICES__REDIS_PORT",
        "--state-dir": "STREAMREC_SERVICES__STATE_DIR",
        "--data-dir": "STREAMREC_SERVICES__DATA_DIR",
    },
}
# Every command that builds its configuration has --log-level (generate builds none).
for _flags in EXPECTED.values():
    _flags["--log-level"] = "STREAMREC_LOG_LEVEL"

# Flags whose setting belongs to the process the command starts: the same job (its consumer
# group, its /metrics port, when it stops, where it listens) in that process's own section.
PER_PROCESS = {"--group-id", "--metrics-port", "--stop-when-idle", "--host"}


def commands(command: Any = None, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """Every command and group, by its path of names (the root is ``""``)."""
    command = command or get_command(app)
    yield " ".join(path), command
    for name, sub in getattr(command, "commands", {}).items():
        yield from commands(sub, (*path, name))


ALL = dict(commands())


def settings_options(command: Any) -> dict[str, Any]:
    """A command's visible options that name an env var, by flag."""
    return {
        p.opts[0]: p for p in command.params
        if p.param_type_name == "option" and getattr(p, "envvar", None) and not p.hidden
    }


def options_shown(help_text: str) -> dict[str, str]:
    """A help's options, by flag: the words of each option's rows, one space apart."""
    entries: dict[str, list[str]] = {}
    current: list[str] = []
    for line in re.sub(r"[│╭╮╰╯─]", " ", help_text).splitlines():
        words = line.split()
        if words and words[0].startswith("--"):
            current = entries[words[0].split(",")[0]] = []
        current.extend(words)
    return {flag: " ".join(words) for flag, words in entries.items()}


def words(text: str) -> list[str]:
    """The words of a rendered help or error, box drawing left out."""
    return re.sub(r"[│╭╮╰╯─]", " ", text).split()


def setting_default(env: str) -> object:
    """The settings model's default of the setting behind ``env``."""
    model: Any = StreamrecConfig()  # no STREAMREC_* env var is set in the unit tests
    parts = env.removeprefix("STREAMREC_").lower().split("__")
    for part in parts:
        model = getattr(model, part)
    return model


def test_every_command_is_in_the_table() -> None:
    assert set(ALL) - set(EXPECTED) == {"", "consumers", "learner", "snapshot", "replay", "generate"}


@pytest.mark.parametrize("path", [*EXPECTED, "", "generate"], ids=lambda p: p or "streamrec")
def test_each_command_offers_the_flags_of_the_settings_it_uses(path: str) -> None:
    found = {flag: p.envvar for flag, p in settings_options(ALL[path]).items()}
    assert found == EXPECTED.get(path, {})


@pytest.mark.parametrize("path", list(EXPECTED))
def test_each_settings_flag_shows_its_env_var_and_default_the_same_way(path: str) -> None:
    result = CliRunner().invoke(app, [*path.split(), "--help"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    entries = options_shown(result.output)
    for flag, env in EXPECTED[path].items():
        default = setting_default(env)
        shown = "null" if default is None else str(default)
        assert entries[flag].endswith(f"[env var: {env}] [default: {shown}]"), (path, entries[flag])


def test_the_same_flag_sets_the_same_setting_on_every_command() -> None:
    settings: dict[str, set[str]] = {}
    for path in EXPECTED:
        for flag, env in EXPECTED[path].items():
            settings.setdefault(flag, set()).add(env if flag not in PER_PROCESS else env.rsplit("__", 1)[1])
    assert {flag: envs for flag, envs in settings.items() if len(envs) > 1} == {}


def test_the_same_setting_has_the_same_flag_on_every_command() -> None:
    flags: dict[str, set[str]] = {}
    for command in ALL.values():
        for flag, param in settings_options(command).items():
            flags.setdefault(param.envvar, set()).add(flag)
    assert {env: names for env, names in flags.items() if len(names) > 1} == {}


def test_settings_flags_name_the_settings_env_names() -> None:
    for command in ALL.values():
        for param in settings_options(command).values():
            parts = param.envvar.removeprefix("STREAMREC_").lower().split("__")
            assert env_name(tuple(parts)) == param.envvar
            setting_default(param.envvar)  # raises if the setting does not exist


def test_old_flag_spellings_stay_as_hidden_aliases() -> None:
    topic = next(p for p in ALL["produce"].params if "--topic" in p.opts)
    assert topic.hidden


def run_cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """The real entry point over an environment without other STREAMREC_* variables."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("STREAMREC_")}
    return subprocess.run(
        [sys.executable, "-m", "streamrec", *args], env={**clean, **env}, cwd=cwd,
        capture_output=True, text=True, timeout=120, check=False,
    )


def test_the_env_var_is_read_by_the_settings_and_a_flag_overrides_it(tmp_path: Path) -> None:
    for name in ("from-env", "from-flag"):
        (tmp_path / name).mkdir()  # a snapshot directory that is not there is refused
    env = {"STREAMREC_LEARNER__SNAPSHOT_DIR": str(tmp_path / "from-env")}
    by_env = run_cli(["snapshot", "list", "--json"], env, tmp_path)
    assert by_env.returncode == 0, by_env.stderr
    assert orjson.loads(by_env.stdout)["root"] == str(tmp_path / "from-env")
    flag = str(tmp_path / "from-flag")
    by_flag = run_cli(["snapshot", "list", "--json", "--snapshot-dir", flag], env, tmp_path)
    assert orjson.loads(by_flag.stdout)["root"] == flag


def test_a_bad_value_in_a_flags_env_var_is_the_settings_one_line_error(tmp_path: Path) -> None:
    # Not Click's usage error: the settings read the variable (null, JSON, their messages).
    proc = run_cli(["snapshot", "prune"], {"STREAMREC_LEARNER__KEEP_SNAPSHOTS": "many"}, tmp_path)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "STREAMREC_LEARNER__KEEP_SNAPSHOTS" in lines[0], lines
    assert "Usage:" not in proc.stderr


def test_the_declared_defaults_are_the_settings_models() -> None:
    # options.py writes them down so that --help need not import pydantic
    for flag in FLAGS.values():
        default = setting_default(flag.env)
        assert flag.default == ("null" if default is None else str(default)), flag.path
        assert isinstance(default, flag.kind | type(None)), flag.path


def test_the_declared_formats_and_generator_defaults_are_the_libraries() -> None:
    from streamrec.datasets import FORMATS as LIBRARY_FORMATS
    from streamrec.datasets.synthetic import ClickStreamSpec

    assert FORMATS == LIBRARY_FORMATS
    spec = ClickStreamSpec()
    assert {name: getattr(spec, name) for name in GENERATE_DEFAULTS} == GENERATE_DEFAULTS


def test_no_help_text_states_a_default_of_its_own() -> None:
    # Every default sits in the one [default: ...] slot, never in the help's prose.
    for path, command in ALL.items():
        for param in command.params:
            assert "default" not in (getattr(param, "help", None) or "").lower(), (path, param.opts)


@pytest.mark.parametrize("path", [p for p, c in ALL.items() if not hasattr(c, "commands")])
def test_every_option_shows_its_default_but_bare_switches(path: str) -> None:
    result = CliRunner().invoke(app, [*path.split(), "--help"], env={"COLUMNS": "250"})
    params = ALL[path].params
    switches = {p.opts[0] for p in params if getattr(p, "is_flag", False) and not p.secondary_opts}
    switches.add("--help")
    for flag, text in options_shown(result.output).items():
        if flag not in switches:
            assert "[default: " in text or "[required]" in text, (path, text)


# Flags whose help differs between commands on purpose: the demo's own micro-batches and
# snapshots; what stops the consumers and the learner; and three names that do different
# jobs in different commands (left as they are, not to break scripts).
DIFFERENT_HELP = {
    "--max-batch", "--snapshot-dir", "--snapshot-every", "--stop-when-idle",
    "--items", "--seed", "--interval",
    "--limit",  # a dataset's earliest N events; the last N dead letters
}


def test_the_same_flag_reads_the_same_on_every_command() -> None:
    helps: dict[str, set[str]] = {}
    for command in ALL.values():
        for param in command.params:
            if param.param_type_name == "option" and not param.hidden:
                helps.setdefault(param.opts[0], set()).add(param.help or "")
    differing = {flag for flag, texts in helps.items() if len(texts) > 1}
    assert differing == DIFFERENT_HELP


def test_every_command_that_reads_the_settings_takes_a_settings_file() -> None:
    for path in EXPECTED:
        options = {p.opts[0] for p in ALL[path].params if p.param_type_name == "option"}
        assert "--config" in options, path


def test_a_settings_file_is_read_under_the_env_vars_and_the_flags(tmp_path: Path) -> None:
    settings = tmp_path / "elsewhere.toml"
    settings.write_text(f'[learner]\nsnapshot_dir = "{tmp_path / "from-file"}"\n')
    for name in ("from-file", "from-env"):
        (tmp_path / name).mkdir()  # a snapshot directory that is not there is refused
    listed = run_cli(["snapshot", "list", "--json", "--config", str(settings)], {}, tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert orjson.loads(listed.stdout)["root"] == str(tmp_path / "from-file")
    env = {"STREAMREC_LEARNER__SNAPSHOT_DIR": str(tmp_path / "from-env")}
    by_env = run_cli(["snapshot", "list", "--json", "--config", str(settings)], env, tmp_path)
    assert orjson.loads(by_env.stdout)["root"] == str(tmp_path / "from-env")


def test_a_missing_settings_file_is_one_line(tmp_path: Path) -> None:
    proc = run_cli(["snapshot", "list", "--config", str(tmp_path / "nothing.toml")], {}, tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"error: the settings file {tmp_path / 'nothing.toml'} does not exist: give an existing TOML file"
    ]


def test_a_settings_file_that_is_a_device_or_a_pipe_is_one_line_saying_so(tmp_path: Path) -> None:
    """Noted by a tour: ``--config /dev/null`` said the file does not exist. The settings'
    reader reads regular files only (it would skip a pipe's settings, as from ``<(...)``).
    """
    proc = run_cli(["snapshot", "list", "--config", "/dev/null"], {}, tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "error: the settings file /dev/null is not a regular file (a device or a pipe): give a TOML file"
    ]


def test_a_settings_file_that_is_a_directory_is_one_line_saying_so(tmp_path: Path) -> None:
    (tmp_path / "cfg").mkdir()
    proc = run_cli(["snapshot", "list", "--config", str(tmp_path / "cfg")], {}, tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"error: the settings file {tmp_path / 'cfg'} is a directory: give a TOML file"
    ]


def test_a_settings_flag_passes_on_only_what_the_command_line_gave() -> None:
    import typer

    from streamrec.cli.options import alias, given, setting

    seen: list[object] = []
    probe = typer.Typer()

    @probe.command()
    def run(
        port: int | None = setting("serving.port"),
        topic: str | None = setting("kafka.events_topic"),
        old_topic: str | None = alias("kafka.events_topic", "--topic"),
    ) -> None:
        seen.append((port, given(topic, old_topic)))

    runner = CliRunner()
    assert runner.invoke(probe, ["--port", "9000", "--topic", "t"]).exit_code == 0
    # the env var and the default are the settings' to read: the command gets None
    assert runner.invoke(probe, [], env={"STREAMREC_SERVING__PORT": "null"}).exit_code == 0
    assert seen == [(9000, "t"), (None, None)]
    bad = runner.invoke(probe, ["--port", "many"])
    assert bad.exit_code == 2 and "'many' is not a valid int" in " ".join(words(bad.output))


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["produce", "synthetic:events=5", "--limit", "-2"], "--limit must be"),
        (["replay", "publish", "synthetic:events=5", "--limit", "-2"], "--limit must be"),
        (["replay", "backtest", "synthetic:events=5", "--limit", "-2"], "--limit"),
        (["produce", "synthetic:events=5", "--rate", "-5"], "--rate must be"),
        (["produce", "synthetic:events=5", "--rate", "nan"], "--rate must be"),
        (["replay", "publish", "synthetic:events=5", "--speedup", "nan"], "--speedup must be positive"),
    ],
    ids=str,
)
def test_a_limit_rate_or_speedup_that_means_nothing_is_refused_before_any_event_is_sent(
    args: list[str], says: str
) -> None:
    """Found by a tour: ``--limit -2`` sent all but the last 2 events (a slice), ``--rate -5``
    and ``nan`` ran as fast as possible, ``--speedup nan`` passed the check of a positive one.
    """
    broker = [] if args[1:2] == ["backtest"] else ["--bootstrap-servers", "127.0.0.1:1"]
    result = CliRunner().invoke(app, [*args, *broker])
    assert result.exit_code == 1 and result.output.startswith("error: ")
    assert says in " ".join(result.output.split()), result.output
