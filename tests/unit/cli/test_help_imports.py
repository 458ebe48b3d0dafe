"""``--help`` imports no heavy module: Paddle, the Kafka and Redis clients, numpy, the
settings, matplotlib and the HTTP server load when a command runs, not to print its help.

Measured before: ``streamrec --help`` imported confluent_kafka, redis, numpy, pydantic and
prometheus_client (about 700 modules, 2.5-3.4 s on the shared 2-core machine).
"""

from __future__ import annotations

import subprocess
import sys

import orjson

HEAVY = (
    "paddle", "confluent_kafka", "matplotlib", "redis", "numpy", "pydantic_settings", "uvicorn",
    "starlette", "prometheus_client", "faust", "msgspec",
)
# Typer (0.29) itself imports pydantic to parse any subcommand's arguments, --help included;
# only the top-level --help can do without it.
TOP_LEVEL_HEAVY = (*HEAVY, "pydantic")

# In a fresh interpreter: every command's --help through the real entry point, then which
# of HEAVY got imported.
_SCRIPT = """
import sys, orjson
from typer.main import get_command
from streamrec.cli import app, main

def paths(command, path=()):
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from paths(sub, (*path, name))

for path in list(paths(get_command(app))):
    sys.argv = ["streamrec", *path, "--help"]
    try:
        main()
    except SystemExit as exc:
        assert exc.code in (0, None), (path, exc.code)
heavy = %r
print(orjson.dumps(sorted(m for m in sys.modules if m.split(".")[0] in heavy)).decode())
"""


def test_help_of_every_command_imports_no_heavy_module() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT % (HEAVY,)], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    imported = orjson.loads(proc.stdout.splitlines()[-1])
    assert imported == []


def test_the_top_level_help_imports_no_heavy_module() -> None:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "streamrec", "--help"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("import time:")]
    modules = {line.split("|")[-1].strip() for line in lines}
    assert sorted(m for m in modules if m.split(".")[0] in TOP_LEVEL_HEAVY) == []
