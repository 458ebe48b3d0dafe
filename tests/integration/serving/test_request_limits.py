"""``streamrec serve``'s size limits, from outside: a real HTTP client against the command's process.

Each refusal names the setting an operator would raise and its value: the candidates of one
request (400), the body's bytes (413).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.serving.test_processes import Served, served
from tests.support import trained_snapshots

MAX_CANDIDATES = 3
MAX_BODY_BYTES = 4096


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One ``streamrec serve --no-store`` with small limits, for the module's tests."""
    root: Path = tmp_path_factory.mktemp("limits")
    trained_snapshots(root, count=1).promote(1)
    settings = {
        "STREAMREC_SERVING__MAX_CANDIDATES": str(MAX_CANDIDATES),
        "STREAMREC_SERVING__MAX_BODY_BYTES": str(MAX_BODY_BYTES),
    }
    with served(root, processes=1, settings=settings) as running:
        yield running


def test_too_many_candidates_names_the_setting_and_its_value(server: Served) -> None:
    # found by a tour: "4 items; at most 3 per request", which setting raises it unsaid
    for items in (["i1", "i2", "i3", "i4"], [1, 2, 3, 4], [{"item_id": f"i{k}"} for k in range(40)]):
        response = httpx.post(f"{server.url}/score", json={"user": "u1", "items": items})
        assert response.status_code == 400, response.text
        reason = response.json()["error"]
        assert f"at most {MAX_CANDIDATES}" in reason and "STREAMREC_SERVING__MAX_CANDIDATES" in reason, reason
    within = httpx.post(f"{server.url}/score", json={"user": "u1", "items": ["i1", "i2", "i3"]})
    assert within.status_code == 200, within.text


def test_a_body_too_large_names_the_setting_and_its_value(server: Served) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: refused once read past the limit
        yield b'{"user": "u1", "items": ["i1"], "pad": "'
        for _ in range(10):
            yield b"x" * 1000

    for body in (b" " * (MAX_BODY_BYTES + 1), chunks()):
        response = httpx.post(f"{server.url}/score", content=body)
        assert response.status_code == 413, response.text
        reason = response.json()["error"]
        assert str(MAX_BODY_BYTES) in reason and "STREAMREC_SERVING__MAX_BODY_BYTES" in reason, reason
