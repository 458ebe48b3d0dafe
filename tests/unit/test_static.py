"""The codebase stays lint- and type-clean, and the type check is one that can fail.

mypy runs as configured in pyproject.toml (``files``: the package, the tests and the
benchmarks). A check that silently turned our own modules into ``Any`` would check nothing,
so a snippet with wrong calls into each package must fail it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("consumers", "featurestore", "learner")


def run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which(tool, path=str(Path(sys.executable).parent)) is None:
        pytest.skip(f"{tool} is not installed (pip install -e '.[test]')")
    exe = str(Path(sys.executable).parent / tool)
    return subprocess.run([exe, *args], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)


def test_ruff() -> None:
    proc = run("ruff", "check", "streamrec", "tests", "bench", "examples", "docs/hooks")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("path", "codes"),
    [("streamrec/undocumented.py", {"D100", "D103"}), ("tests/unit/test_undocumented.py", set())],
)
def test_ruff_checks_docstrings_outside_tests(path: str, codes: set[str]) -> None:
    """The API reference is rendered from the package's docstrings, so a missing one fails the
    lint; a test's name says what it checks, so tests need none.
    """
    run("ruff", "--version")  # skips when ruff is missing
    ruff = str(Path(sys.executable).parent / "ruff")
    proc = subprocess.run(
        [ruff, "check", "--output-format", "concise", "--stdin-filename", path],
        input="def f() -> None:\n    pass\n",
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert set(re.findall(r"\b(D\d{3})\b", proc.stdout)) == codes, proc.stdout


def test_mypy() -> None:
    proc = run("mypy")
    assert proc.returncode == 0, proc.stdout + proc.stderr


WRONG_CALLS = """\
from streamrec.consumers.processor import SampleBuilder
from streamrec.featurestore import MemoryFeatureStore
from streamrec.learner.columns import SampleColumns

SampleBuilder(1, 2, 3, 4, 5)
MemoryFeatureStore("three")
SampleColumns.from_samples(42)
"""

RIGHT_CALLS = """\
from streamrec.config import ConsumerConfig
from streamrec.consumers.processor import SampleBuilder
from streamrec.featurestore import MemoryFeatureStore
from streamrec.learner.columns import SampleColumns

SampleBuilder(ConsumerConfig(), MemoryFeatureStore(3))
SampleColumns.from_samples([])
"""


def test_mypy_catches_a_wrong_call_into_each_package(tmp_path: Path) -> None:
    wrong, right = tmp_path / "wrong.py", tmp_path / "right.py"
    wrong.write_text(WRONG_CALLS)
    right.write_text(RIGHT_CALLS)
    proc = run("mypy", "--no-incremental", str(wrong), str(right))
    lines = {int(n) for n in re.findall(r"wrong\.py:(\d+): error", proc.stdout)}
    assert lines == {5, 6, 7}, proc.stdout  # one call into consumers, featurestore, learner
    assert "right.py" not in proc.stdout, proc.stdout


@pytest.mark.parametrize("package", PACKAGES)
def test_each_module_has_one_import_name(package: str) -> None:
    """The design card's top-level folders link into streamrec/ and cannot import as
    themselves, so no file loads as two modules with two copies of its classes.
    """
    link = ROOT / package
    assert link.is_symlink() and link.resolve() == (ROOT / "streamrec" / package).resolve()
    proc = subprocess.run(
        [sys.executable, "-c", f"import {package}"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert proc.returncode != 0 and f"import streamrec.{package}, not {package}" in proc.stderr


# A module past ~500 lines is two modules (CONVENTIONS.md, "Shape"): split it by job.
MODULE_MAX_LINES = 500
CODE_ROOTS = ("streamrec", "bench", "examples", "docs/hooks")


def test_every_module_stays_under_the_size_limit() -> None:
    modules = [path for root in CODE_ROOTS for path in sorted((ROOT / root).rglob("*.py"))]
    assert len(modules) > 100  # the roots were found
    sizes = {path.relative_to(ROOT).as_posix(): len(path.read_text().splitlines()) for path in modules}
    over = {path: n for path, n in sizes.items() if n > MODULE_MAX_LINES}
    assert not over, f"modules past {MODULE_MAX_LINES} lines (split each by job): {over}"
