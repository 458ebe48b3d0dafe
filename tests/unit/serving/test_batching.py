"""Requests queued for one predictor run as one call and each gets its own rows back."""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from streamrec.serving.batching import Combiner
from streamrec.serving.export import export_dir
from streamrec.serving.scorer import Candidate, ExportedModel
from tests.support import trained_snapshots


class SlowSum:
    """A predictor stand-in: each row's sum, after a pause, counting calls and their rows."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.calls: list[int] = []
        self.fail_on = fail_on

    def __call__(self, feed: Mapping[str, np.ndarray]) -> np.ndarray:
        time.sleep(0.02)
        if self.fail_on is not None and self.fail_on in feed["x"][:, 0]:
            raise ValueError("bad row")
        self.calls.append(len(feed["x"]))
        return feed["x"].sum(axis=1) + feed["y"]


def feed(k: int, rows: int) -> dict[str, np.ndarray]:
    return {"x": np.full((rows, 3), k, np.float32), "y": np.arange(rows, dtype=np.float32)}


def test_waiting_requests_run_as_one_call_each_with_its_own_rows() -> None:
    run = SlowSum()
    combine = Combiner(run, max_rows=40)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda k: combine(feed(k, 1 + k % 5)), range(24)))
    for k, out in enumerate(results):
        assert out.tolist() == (3 * k + np.arange(1 + k % 5)).tolist()
    assert len(run.calls) < 24 and max(run.calls) <= 40  # combined, within the bound
    assert combine.requests == 24 and combine.calls == len(run.calls)


def test_a_lone_request_runs_at_once_and_zero_never_combines() -> None:
    run = SlowSum()
    combine = Combiner(run, max_rows=0)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda k: combine(feed(k, 3)), range(8)))
    assert run.calls == [3] * 8
    start = time.perf_counter()
    Combiner(SlowSum(), max_rows=400)(feed(1, 2))
    assert time.perf_counter() - start < 0.5


def test_a_failed_call_fails_its_requests_only() -> None:
    combine = Combiner(SlowSum(fail_on=7), max_rows=1)  # every request alone
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(combine, feed(k, 2)) for k in range(10)]
    for k, future in enumerate(futures):
        if k == 7:
            with pytest.raises(ValueError, match="bad row"):
                future.result()
        else:
            assert future.result().tolist() == [3.0 * k, 3.0 * k + 1]


def test_an_export_scores_the_same_alone_and_batched(tmp_path: Path) -> None:
    trained_snapshots(tmp_path, count=1)
    alone = ExportedModel(export_dir(tmp_path, 1))
    batched = ExportedModel(export_dir(tmp_path, 1), batch_candidates=64)
    requests = [
        (
            f"u{k}",
            [(f"i{(k + j) % 40}", f"c{j % 5}") for j in range(k % 6)],
            [Candidate(f"i{(k * 7 + j) % 40}", f"c{j % 5}") for j in range(1 + k % 9)],
        )
        for k in range(30)
    ]
    want = [alone.score(*r) for r in requests]
    combiner = batched.combiner
    assert combiner is not None
    # The first six queue while the predictor is held, so they combine however the threads are
    # scheduled (a barrier alone let a loaded machine run them one by one: calls == 30).
    with ThreadPoolExecutor(6) as pool:
        with combiner._run_lock:
            first = [pool.submit(batched.score, *requests[k]) for k in range(6)]
            deadline = time.monotonic() + 60
            while len(combiner._waiting) < 6 and time.monotonic() < deadline:
                time.sleep(0.001)
        got = [f.result() for f in first] + list(pool.map(lambda r: batched.score(*r), requests[6:]))
    for w, g in zip(want, got, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert combiner.calls < 30  # the six held several requests a call
