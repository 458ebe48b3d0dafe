"""Shared test fixtures: the bundled MovieLens, a seeded generated click stream, and the real
Taobao file from ``../shared/data`` where it exists (extra coverage only: no guarantee test
may depend on it, since a fresh clone has no such folder).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import streamrec.kernelsettings
from streamrec.datasets.synthetic import ClickStreamSpec, generate_clicks
from streamrec.events import Event

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("STREAMREC_SHARED_DATA", ROOT.parent / "shared" / "data"))
MOVIELENS = ROOT / "streamrec" / "demo_data" / "movielens-latest-small"


@pytest.fixture(scope="session", autouse=True)
def mkl_left_to_itself() -> Iterator[None]:
    """Commands invoked in the test process do not choose MKL's code path for it.

    A CLI command sets ``MKL_DEBUG_CPU_TYPE`` on some processors (`streamrec.kernelsettings`);
    in process, that would hold for every later test, and their floats with it.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(streamrec.kernelsettings, "prefer_vector_kernels", lambda *args, **kwargs: False)
        yield


@pytest.fixture(scope="session")
def clicks() -> list[Event]:
    """A generated implicit click stream (pv/cart/fav/buy, new items arriving), seed 7."""
    return generate_clicks(ClickStreamSpec(seed=7))


@pytest.fixture(scope="session")
def taobao_path() -> Path:
    """Taobao UserBehavior for 814 users (not bundled: its licence forbids redistribution)."""
    path = SHARED_DATA / "taobao-userbehavior-814users" / "UserBehavior.csv"
    if not path.exists():
        pytest.skip(f"{path} not present (set STREAMREC_SHARED_DATA to the data folder)")
    return path


@pytest.fixture(scope="session")
def movielens_path() -> Path:
    """The bundled MovieLens latest-small folder."""
    return MOVIELENS
