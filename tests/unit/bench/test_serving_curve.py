"""The serving benchmark's latency curve counts what the server sheds instead of failing on it,
and draws the curve an operator sizes a fleet by.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from aiohttp import ClientResponseError

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from serving_latency import open_loop, plot_curve  # noqa: E402  (bench/ is a folder of scripts)

from tests.unit.bench.shedding import shedding_server  # noqa: E402


async def _against_a_server_that_sheds_every_other_request(shed: list[float] | None) -> list[float]:
    async with shedding_server(2) as url:
        return await open_loop(url, [{"user": "1"}], 200.0, 0.1, shed=shed)


def test_a_shed_request_is_counted_not_a_failure() -> None:
    shed: list[float] = []
    answered = asyncio.run(_against_a_server_that_sheds_every_other_request(shed))
    assert len(answered) == 10 and len(shed) == 10


def test_without_a_shed_list_a_503_fails_the_run() -> None:
    with pytest.raises(ClientResponseError, match="503"):
        asyncio.run(_against_a_server_that_sheds_every_other_request(None))


def test_the_curve_is_drawn(tmp_path: Path) -> None:
    points = [
        {"offered_per_s": r, "answered_per_s": min(r, 120.0), "p50_ms": 5.0 + r / 50, "p99_ms": 9.0 + r / 10,
         "shed_share": max(0.0, 1 - 120.0 / r)}
        for r in (25.0, 50.0, 100.0, 200.0)
    ]
    plot_curve(points, 110.0, tmp_path / "curve.png")
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
