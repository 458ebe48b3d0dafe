"""The examples in the docstrings run and print what they say they print.

Every module whose source holds an example (``>>>``) is listed here, so none is skipped
silently; each listed module must have at least one, so none is listed for nothing. The
examples need no broker and no Redis.
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = (
    "streamrec",
    "streamrec.cli.learner",
    "streamrec.config.loading",
    "streamrec.consumers.processor",
    "streamrec.datasets.declared",
    "streamrec.deadletter_summary",
    "streamrec.datasets.sources",
    "streamrec.datasets.synthetic",
    "streamrec.errors",
    "streamrec.events",
    "streamrec.jsonerrors",
    "streamrec.wording",
    "streamrec.features.schema",
    "streamrec.featurestore.memory",
    "streamrec.featurestore.values",
    "streamrec.featurestore.profiles",
    "streamrec.kafka.partitioning",
    "streamrec.kafka.records",
    "streamrec.lazy",
    "streamrec.learner.columns",
    "streamrec.learner.checks",
    "streamrec.learner.deepfm_learner",
    "streamrec.learner.din",
    "streamrec.learner.drift",
    "streamrec.learner.hashing",
    "streamrec.learner.idstats",
    "streamrec.learner.metrics",
    "streamrec.learner.outputs",
    "streamrec.replay.ablation",
    "streamrec.replay.batches",
    "streamrec.replay.intake",
    "streamrec.samples",
    "streamrec.serving.drift",
    "streamrec.snapshots.store",
)
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def run_examples(module_name: str) -> tuple[doctest.TestResults, str]:
    """Run a module's examples: the results, and the report of any that failed."""
    module = importlib.import_module(module_name)
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    for test in doctest.DocTestFinder().find(module, module_name):
        runner.run(test, out=report.append)
    return runner.summarize(verbose=False), "".join(report)


@pytest.mark.parametrize("module_name", MODULES)
def test_examples(module_name: str) -> None:
    results, report = run_examples(module_name)
    assert results.attempted > 0, f"{module_name} is listed but has no examples"
    assert results.failed == 0, report


def test_every_module_with_examples_is_listed() -> None:
    found = set()
    for path in (ROOT / "streamrec").rglob("*.py"):
        if ">>> " in path.read_text():
            parts = path.relative_to(ROOT).with_suffix("").parts
            found.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    assert found == set(MODULES)


def test_a_wrong_example_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner reports an example whose output differs, rather than passing everything."""
    from streamrec.learner import metrics

    monkeypatch.setattr(metrics.auc, "__doc__", ">>> auc([0, 1], [0.2, 0.1])\n1.0\n")
    results, report = run_examples("streamrec.learner.metrics")
    assert results.failed == 1, report
    assert "Expected:\n    1.0\nGot:\n    0.0" in report
