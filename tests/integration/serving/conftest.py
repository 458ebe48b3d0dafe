"""Trained versions for the traffic tests: trained once per module, copied for each test."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from streamrec.snapshots.store import SnapshotStore
from tests.support import trained_snapshots


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three trained versions of a small DIN, each exported; nothing promoted."""
    root = tmp_path_factory.mktemp("trained") / "snapshots"
    trained_snapshots(root, count=3)
    return root


@pytest.fixture
def root(trained: Path, tmp_path: Path) -> Path:
    """This test's copy of the trained versions, v000001 served."""
    copy = tmp_path / "snapshots"
    shutil.copytree(trained, copy)
    SnapshotStore(copy).promote(1)
    return copy
