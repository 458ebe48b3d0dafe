"""``streamrec serve`` under overload, oversized bodies and ids typed as the event contract types
them: a bounded queue that sheds with 503 and Retry-After, a latency metric that includes the
wait, 413 before a body is read, integer ids scored as their string form.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from streamrec.config import ServingConfig
from streamrec.serving.http import BadRequest, build_app, no_history, parse_request
from streamrec.serving.scorer import Scorer
from tests.support import SERVED_ENGINE, serving, trained_snapshots

SLOW_S = 0.6  # a feature store this slow to answer one user's sequence: a deliberate overload


@pytest.fixture(scope="module")
def scorer(tmp_path_factory: pytest.TempPathFactory) -> Scorer:
    root = tmp_path_factory.mktemp("snapshots")
    store = trained_snapshots(root, count=1)
    store.promote(1)
    return Scorer(root)


def slow_history(user: str) -> list[tuple[str, str]]:
    time.sleep(SLOW_S)
    return [("i1", "c1")]


def make_app(
    scorer: Scorer, history_of: Callable[[str], Sequence[tuple[str, str]]], **settings: Any
) -> ASGIApp:
    return build_app(scorer, history_of, ServingConfig(**settings))


def fire(url: str, count: int, body: dict[str, Any]) -> list[tuple[int, float, httpx.Headers]]:
    """``count`` concurrent requests, each on its own connection: (status, seconds, headers)."""
    results: list[tuple[int, float, httpx.Headers]] = []
    barrier = threading.Barrier(count)

    def one() -> None:
        with httpx.Client(timeout=30) as client:
            barrier.wait()
            started = time.monotonic()
            response = client.post(f"{url}/score", json=body)
            results.append((response.status_code, time.monotonic() - started, response.headers))

    threads = [threading.Thread(target=one) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


def histogram(metrics: str, name: str) -> dict[str, float]:
    """``le`` -> cumulative count of one histogram in a Prometheus text page (plus "count")."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics):
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.name == f"{name}_bucket":
                out[sample.labels["le"]] = sample.value
            elif sample.name == f"{name}_count":
                out["count"] = sample.value
    return out


WARM = {"user": "u1", "items": ["i1:c1"], "history": [["i1", "c1"]]}  # scored without the store


def test_overload_is_shed_at_once_with_retry_after(scorer: Scorer) -> None:
    wait_s = 0.5
    app = make_app(scorer, slow_history, workers=1, max_in_flight=4, max_queue_wait_s=wait_s)
    with serving(app) as url:
        assert httpx.post(f"{url}/score", json=WARM).status_code == 200
        results = fire(url, 16, {"user": "u1", "items": ["i1:c1", "i2:c2"]})
    statuses = sorted(status for status, _, _ in results)
    assert len(results) == 16
    assert 200 in statuses and statuses.count(503) >= 12, statuses  # 4 admitted, at most 2 served
    for status, seconds, headers in results:
        if status == 503:
            assert headers.get("retry-after") == "1"
            # shed at once, or after waiting its bound in the queue; never longer
            assert seconds < wait_s + 1.0, f"a 503 took {seconds:.2f} s"
        else:
            assert status == 200
            assert seconds < wait_s + SLOW_S + 1.0, f"a 200 took {seconds:.2f} s"


def test_shed_counts_exist_at_zero_before_any_shed(scorer: Scorer) -> None:
    # Found by a tour: docs/operating/metrics.md alerts on rate(streamrec_serving_shed_total[5m]),
    # but a server that had shed nothing exposed no series, so the first shed went unseen by rate()
    app = make_app(scorer, slow_history, workers=1, max_in_flight=4, max_queue_wait_s=0.5)
    with serving(app) as url:
        metrics = httpx.get(f"{url}/metrics").text
    shed = {
        s.labels["cause"]: s.value
        for family in text_string_to_metric_families(metrics)
        for s in family.samples
        if s.name == "streamrec_serving_shed_total"
    }
    assert shed == {"in_flight": 0.0, "queue_wait": 0.0}


def test_request_seconds_include_the_wait_in_the_queue(scorer: Scorer) -> None:
    app = make_app(scorer, slow_history, workers=1, max_in_flight=8, max_queue_wait_s=5.0)
    with serving(app) as url:
        results = fire(url, 2, {"user": "u1", "items": ["i1:c1"]})
        assert [status for status, _, _ in results] == [200, 200]
        metrics = httpx.get(f"{url}/metrics").text
    total = histogram(metrics, "streamrec_serving_request_seconds")
    # the second request waited for the first (SLOW_S) and then took SLOW_S itself
    assert total["count"] == 2 and total["1.0"] <= 1, total
    waited = histogram(metrics, "streamrec_serving_queue_wait_seconds")
    assert waited["count"] == 2 and waited["0.5"] <= 1, waited


class BodySpy:
    """An ASGI wrapper counting the body bytes the app read."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.read = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def counted() -> Message:
            message = await receive()
            self.read += len(message.get("body", b""))
            return message

        await self.app(scope, counted, send)


def raw_request(url: str, head: bytes) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.sendall(head)
    return sock


def status_line(sock: socket.socket) -> bytes:
    return sock.recv(65536).split(b"\r\n", 1)[0]


def test_a_body_over_the_limit_gets_413_before_it_is_read(scorer: Scorer) -> None:
    spy = BodySpy(make_app(scorer, no_history, max_body_bytes=4096))
    with serving(spy) as url:
        # announced: answered from the header, nothing read
        with raw_request(url, b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 60000000\r\n\r\n" + b" " * 1000) as sock:
            started = time.monotonic()
            assert b" 413 " in status_line(sock)
            assert time.monotonic() - started < 2
        assert spy.read <= 1000
        # chunked: read up to the limit, then refused; the rest is never read
        spy.read = 0
        with raw_request(url, b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n") as sock:
            chunk = b"1000\r\n" + b" " * 4096 + b"\r\n"
            sent = 0
            with pytest.raises(OSError):  # the server closes the connection on us
                while sent < 60_000_000:
                    sock.sendall(chunk)
                    sent += 4096
            assert sent < 60_000_000
        assert spy.read <= 4096 + 2 * 65536, spy.read  # a message or two of uvicorn's buffer
        # within the limit: answered as usual
        assert httpx.post(f"{url}/score", json=WARM).status_code == 200


def test_a_413_over_http_names_the_limit(scorer: Scorer) -> None:
    with serving(make_app(scorer, no_history, max_body_bytes=4096)) as url:
        response = httpx.post(f"{url}/score", content=b" " * 5000)
        assert response.status_code == 413
        assert "4096" in response.json()["error"]


def test_integer_ids_score_as_their_string_form(scorer: Scorer) -> None:
    app = make_app(scorer, no_history)
    with serving(app) as url:
        as_ints = httpx.post(f"{url}/score", json={
            "user": 42, "items": [1001, {"item": 1002, "category": 7}, "1003:7"],
            "history": [[998, 7], ["997", 7]],
        })
        as_strings = httpx.post(f"{url}/score", json={
            "user": "42", "items": ["1001", {"item": "1002", "category": "7"}, "1003:7"],
            "history": [["998", "7"], ["997", "7"]],
        })
    assert as_ints.status_code == 200, as_ints.text
    assert np.array_equal(as_ints.json()["scores"], as_strings.json()["scores"])


def test_ids_are_checked_as_the_event_contract_checks_them() -> None:
    user, candidates, history = parse_request(
        b'{"user": 1180591620717411303424, "items": [5, {"item": 6, "category": 2}], "history": [[1, 2]]}', 10
    )
    assert user == "1180591620717411303424"  # 2**70, exact, as events keep it
    assert [(c.item_id, c.category_id) for c in candidates] == [("5", None), ("6", "2")]
    assert history == [("1", "2")]
    for bad, reason in [
        (b'{"user": true, "items": ["a"]}', "'user'"),
        (b'{"user": 1.5, "items": ["a"]}', "'user'"),
        (b'{"user": "u", "items": [false]}', "an item"),
        (b'{"user": "u", "items": [{"item": 3, "category": 1.0}]}', "category"),
        (b'{"user": "u", "items": ["a"], "history": [[1, null]]}', "'history'"),
        (b'{"user": "' + b"x" * 129 + b'", "items": ["a"]}', "1..128"),
    ]:
        with pytest.raises(BadRequest, match=reason):
            parse_request(bad, 10)


def test_liveness_apart_from_readiness(scorer: Scorer) -> None:
    """Readiness follows the feature store, checked at most once per ``ready_cache_s`` whatever
    the probe rate; liveness answers 200 throughout.
    """
    calls: list[str] = []
    down = threading.Event()

    def history_of(user: str) -> list[tuple[str, str]]:
        calls.append(user)
        if down.is_set():
            raise ConnectionError("redis unavailable: connection refused")
        return []

    cache_s = 1.0
    app = make_app(scorer, history_of, ready_cache_s=cache_s)
    with serving(app) as url, httpx.Client() as client:
        ready = client.get(f"{url}/readyz")
        assert ready.status_code == 200 and ready.json()["status"] == "ok"
        down.set()
        time.sleep(cache_s + 0.05)
        calls.clear()
        started = time.monotonic()
        for _ in range(50):  # a probe storm: one check a cache_s
            ready = client.get(f"{url}/readyz")
            assert ready.status_code == 503
        assert 1 <= len(calls) <= 1 + (time.monotonic() - started) // cache_s, calls
        assert "feature store" in ready.json()["reasons"][0]
        health = client.get(f"{url}/healthz")
        assert health.status_code == 503 and health.json()["status"] == "unavailable"
        assert client.get(f"{url}/livez").status_code == 200
        down.clear()
        time.sleep(cache_s + 0.05)
        assert client.get(f"{url}/readyz").status_code == 200
        assert client.get(f"{url}/healthz").json() == {
            "status": "ok", "version": 1, "current": 1, "serves_current": True, "engine": SERVED_ENGINE,
            "arms": {"served": {"version": 1, "engine": SERVED_ENGINE}},
        }
        assert client.get(f"{url}/livez").status_code == 200


def test_serving_settings_have_sensible_defaults() -> None:
    cfg = ServingConfig()
    assert cfg.max_body_bytes == 1 << 20
    assert cfg.max_header_bytes == 16 << 10  # as h11's and Node.js's
    assert 0 < cfg.header_timeout_s <= 60
    assert cfg.max_in_flight >= cfg.workers >= 1
    assert 0 < cfg.max_queue_wait_s <= 1
    with pytest.raises(ValueError):
        ServingConfig(max_in_flight=0)


def test_a_body_cut_short_by_its_client_is_a_client_error_not_a_scoring_failure(
    scorer: Scorer, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by the serving-lifetime tour (malformed requests at load): a client that closed the
    connection before its body's ``Content-Length`` was read, or sent a malformed chunk, was
    logged as ``ERROR score request failed error=`` (no reason: the exception's text is empty),
    as a feature store outage is, and counted as a 503. It is the client's: a 400 counted as one,
    logged at most at debug level.
    """
    caplog.set_level("DEBUG", logger="streamrec")
    with serving(make_app(scorer, no_history)) as url:
        head = b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        with raw_request(url, head + b"Content-Length: 100\r\n\r\n" + b'{"user": "1"'):
            time.sleep(0.3)  # the server reads what came, then the client goes
        with raw_request(url, head + b"Transfer-Encoding: chunked\r\n\r\n" + b"zz\r\n") as sock:
            assert b" 400 " in status_line(sock)
        assert httpx.post(f"{url}/score", json=WARM).status_code == 200
        deadline = time.monotonic() + 5
        while True:
            statuses = {
                sample.labels["status"]: sample.value
                for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)
                for sample in family.samples
                if sample.name == "streamrec_serving_requests_total"
            }
            if statuses.get("400", 0) >= 2 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    assert statuses.get("503", 0) == 0 and statuses.get("400") == 2, statuses
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "streamrec" in r.name]
    assert not said, said
