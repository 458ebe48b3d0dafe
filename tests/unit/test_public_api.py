"""Each package's public surface: what ``__all__`` names exists, and importing it stays cheap.

Packages re-export lazily (`streamrec.lazy`): a name is imported from its module when it is
first read, so these checks run each in a fresh interpreter where import order matters.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

from streamrec.lazy import lazy_exports

PACKAGES = (
    "streamrec",
    "streamrec.consumers",
    "streamrec.datasets",
    "streamrec.featurestore",
    "streamrec.kafka",
    "streamrec.learner",
    "streamrec.observability",
    "streamrec.replay",
    "streamrec.serving",
    "streamrec.snapshots",
)
# Importing any of these must not load them: ``streamrec --help`` imports the packages.
HEAVY = ("paddle", "redis", "confluent_kafka", "starlette", "matplotlib")


def _python(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("package", PACKAGES)
def test_every_name_in_all_imports(package: str) -> None:
    module = importlib.import_module(package)
    names = module.__all__
    assert names, f"{package} names no public surface"
    assert len(set(names)) == len(names), f"{package}.__all__ names a name twice"
    for name in names:
        value = getattr(module, name)
        assert value is not None
        defined_in = getattr(value, "__module__", None)
        if isinstance(defined_in, str) and defined_in.startswith("streamrec."):
            # the re-export is the object its module defines, not a copy or a stale alias
            assert getattr(importlib.import_module(defined_in), name) is value
    assert set(names) <= set(dir(module))


@pytest.mark.parametrize("package", [p for p in PACKAGES if p != "streamrec.observability"])
def test_type_checkers_see_every_lazy_export(package: str) -> None:
    """A name re-exported lazily but not imported under ``if TYPE_CHECKING:`` would reach mypy
    and the API reference through ``__getattr__`` as ``Any``.
    """
    module = importlib.import_module(package)
    tree = ast.parse(Path(module.__file__ or "").read_text())
    typed = {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
        for stmt in node.body
        if isinstance(stmt, ast.ImportFrom)
        for alias in stmt.names
    }
    defined = {name for name in module.__all__ if name in vars(module) and name not in typed}
    lazy = set(module.__all__) - defined
    assert lazy <= typed, f"not imported under TYPE_CHECKING: {sorted(lazy - typed)}"


@pytest.mark.parametrize("package", PACKAGES)
def test_no_export_hides_a_module(package: str) -> None:
    """A re-exported ``backtest`` function would replace ``streamrec.replay.backtest`` the module
    as the package's attribute once read: ``from streamrec.replay import backtest`` would then
    give either, depending on what ran first.
    """
    module = importlib.import_module(package)
    submodules = {info.name for info in pkgutil.iter_modules(module.__path__)}
    assert not submodules & set(module.__all__)


@pytest.mark.parametrize("package", [p for p in PACKAGES if p != "streamrec.observability"])
def test_importing_a_package_loads_nothing_heavy(package: str) -> None:
    loaded = _python(f"import sys, {package}; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    assert loaded.split() == []


def test_import_streamrec_does_not_import_paddle() -> None:
    assert _python("import sys, streamrec; print('paddle' in sys.modules)").strip() == "False"


def test_a_lazy_name_imports_its_module_on_first_use() -> None:
    code = (
        "import sys, streamrec.learner as l; l.SampleColumns; "
        "print('streamrec.learner.columns' in sys.modules)"
    )
    assert _python(code).strip() == "True"


def test_an_unknown_name_is_an_attribute_error() -> None:
    import streamrec.learner

    with pytest.raises(AttributeError, match="has no attribute 'DinLearner'"):
        streamrec.learner.DinLearner  # noqa: B018
    with pytest.raises(ImportError):
        from streamrec.learner import DinLearner  # noqa: F401


def test_lazy_exports_answers_only_the_names_it_lists() -> None:
    getattr_, dir_ = lazy_exports("streamrec", {"streamrec.errors": ["ConfigError"]})
    from streamrec.errors import ConfigError

    assert getattr_("ConfigError") is ConfigError
    assert "ConfigError" in dir_()
    with pytest.raises(AttributeError):
        getattr_("StreamrecError")
