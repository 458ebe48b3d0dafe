"""The codebase stays lint- and type-clean (ruff and mypy as configured in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ["streamrec", "consumers", "learner", "featurestore"]


def run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which(tool, path=str(Path(sys.executable).parent)) is None:
        pytest.skip(f"{tool} is not installed (pip install -e '.[test]')")
    exe = str(Path(sys.executable).parent / tool)
    return subprocess.run([exe, *args], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)


def test_ruff() -> None:
    proc = run("ruff", "check", *SOURCES, "tests", "bench")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy() -> None:
    proc = run("mypy", *SOURCES)
    assert proc.returncode == 0, proc.stdout + proc.stderr
