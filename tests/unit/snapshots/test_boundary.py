"""The snapshot package stands on its own: the learner writes versions, serving reads them.

``streamrec.snapshots`` is imported by the learner, serving and the CLI; were it to import any
of them back, a change to the model or the HTTP server would reach the snapshot format, and
reading a snapshot would load Paddle. The imports are read from the source (every ``import``
and ``from ... import``, those under ``if TYPE_CHECKING:`` and inside functions included).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import streamrec.snapshots

PACKAGE = Path(streamrec.snapshots.__file__).parent
# What the snapshot package must never import: the packages that use it, and the heavy clients.
FORBIDDEN = ("streamrec.learner", "streamrec.serving", "streamrec.cli", "streamrec.pipeline", "paddle")


def imported(source: str) -> set[str]:
    """Every module name ``source`` imports, wherever the import stands."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def forbidden(names: set[str]) -> list[str]:
    """The names among ``names`` that reach into a package snapshots must not import."""
    return sorted(n for n in names if any(n == f or n.startswith(f"{f}.") for f in FORBIDDEN))


def test_the_scan_sees_every_form_of_import() -> None:
    source = (
        "import streamrec.learner.din\n"
        "from streamrec.serving import scorer\n"
        "if TYPE_CHECKING:\n    from streamrec.learner.columns import SampleColumns\n"
        "def f():\n    import paddle\n"
        "from streamrec.snapshots.delta import make_delta\n"
    )
    assert forbidden(imported(source)) == [
        "paddle", "streamrec.learner.columns", "streamrec.learner.columns.SampleColumns",
        "streamrec.learner.din",
        "streamrec.serving", "streamrec.serving.scorer",
    ]


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_no_snapshot_module_imports_the_learner_or_serving(path: Path) -> None:
    assert forbidden(imported(path.read_text())) == [], f"{path.name} reaches into a user of snapshots"


def test_loading_the_store_loads_neither_the_learner_nor_serving() -> None:
    code = (
        "import sys, streamrec.snapshots as s; s.SnapshotStore; s.diff_snapshots; s.check_export; "
        "import streamrec.snapshots.materialize; "
        "print(' '.join(sorted(m for m in sys.modules if m.startswith(('streamrec.learner', "
        "'streamrec.serving', 'paddle')))))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert proc.stdout.split() == []


LEARNER = PACKAGE.parent / "learner"


@pytest.mark.parametrize("path", sorted(LEARNER.glob("*.py")), ids=lambda p: p.name)
def test_the_learner_writes_versions_without_reaching_into_serving(path: Path) -> None:
    """The learner hands each version to serving's gate through a callback (``on_snapshot``)."""
    names = imported(path.read_text())
    assert sorted(n for n in names if n == "streamrec.serving" or n.startswith("streamrec.serving.")) == []
