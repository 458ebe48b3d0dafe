"""``streamrec serve``'s size limits, from outside: a real HTTP client against the command's process.

Each refusal names the setting an operator would raise and its value: the candidates of one
request (400), the body's bytes (413), the request line's and headers' bytes (431, or 414 for a
request line alone past it), refused as soon as the head passes it, not read to its end, each
answer read by a client that sends on; and a head that does not come whole within its time (408,
or closed when nothing came).
"""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.integration.serving.test_processes import Served, served
from tests.support import trained_snapshots

MAX_CANDIDATES = 3
MAX_BODY_BYTES = 4096
MAX_HEADER_BYTES = 8192
HEADER_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One ``streamrec serve --no-store`` with small limits, for the module's tests."""
    root: Path = tmp_path_factory.mktemp("limits")
    trained_snapshots(root, count=1).promote(1)
    settings = {
        "STREAMREC_SERVING__MAX_CANDIDATES": str(MAX_CANDIDATES),
        "STREAMREC_SERVING__MAX_BODY_BYTES": str(MAX_BODY_BYTES),
        "STREAMREC_SERVING__MAX_HEADER_BYTES": str(MAX_HEADER_BYTES),
        "STREAMREC_SERVING__HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
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


def test_a_client_that_sends_its_large_body_whole_then_reads_gets_the_413(server: Served) -> None:
    """Found by a tour: a client sending a 1 MB or 10 MB body with its length, then reading (a raw
    socket, 5 of 5 each), got a broken pipe or a reset, never the 413: the server closed the
    connection with the body unread. httpx read it, as it reads a response when a send fails.
    """
    host, port = server.url.removeprefix("http://").split(":")
    size = 10_000_000
    for chunked in (False, True):
        framing = b"Transfer-Encoding: chunked" if chunked else b"Content-Length: %d" % size
        body = b"%x\r\n%s\r\n0\r\n\r\n" % (size, b" " * size) if chunked else b" " * size
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            head = b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%s\r\n\r\n"
            sock.sendall(head % framing)
            sock.sendall(body)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
        assert b"STREAMREC_SERVING__MAX_BODY_BYTES" in answer and b"connection: close" in answer.lower()
    assert httpx.post(f"{server.url}/score", json={"user": "u1", "items": ["i1"]}).status_code == 200


def score_with_header(
    server: Served, name: str, value: str, path: str = "/score"
) -> tuple[int, dict[str, str], bytes]:
    """One ``POST /score`` by http.client with one more header: (status, headers, body)."""
    host, port = server.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        body = orjson.dumps({"user": "u1", "items": ["i1"], "history": []})
        connection.request("POST", path, body, {"Content-Type": "application/json", name: value})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def test_a_header_too_large_gets_431_naming_the_setting(server: Served) -> None:
    # found by a tour: a 200 KB header was read whole and answered 200 (20 MB too, in 0.4 s):
    # uvicorn's httptools parser bounds no header, where its h11 one stops at 16 KiB
    status, headers, body = score_with_header(server, "X-Big", "a" * 200_000)
    assert status == 431, body
    reason = orjson.loads(body)["error"]
    assert str(MAX_HEADER_BYTES) in reason and "STREAMREC_SERVING__MAX_HEADER_BYTES" in reason, reason
    assert headers.get("connection") == "close"
    # many headers adding up past it, each small
    many = {f"X-H{k}": "v" * 100 for k in range(100)}
    host, port = server.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request("POST", "/score", b'{"user": "u1", "items": ["i1"]}', many)
    assert connection.getresponse().status == 431
    connection.close()
    # within it: served
    status, _, body = score_with_header(server, "X-Fine", "a" * (MAX_HEADER_BYTES // 2))
    assert status == 200, body


def test_a_request_line_too_long_gets_414(server: Served) -> None:
    status, _, body = score_with_header(server, "X-Fine", "1", path="/score?" + "q" * (2 * MAX_HEADER_BYTES))
    assert status == 414, body
    assert "STREAMREC_SERVING__MAX_HEADER_BYTES" in orjson.loads(body)["error"]


def test_a_header_that_never_ends_is_refused_before_it_is_read_whole(server: Served) -> None:
    """A client sending one header value without end: answered 431 and closed once the head passes
    the limit (a kernel's socket buffers later), where the server read it all before.
    """
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nX-Endless: ")
        sock.setblocking(False)
        sent, answer, deadline = 0, b"", time.monotonic() + 20
        while not answer and sent < 200_000_000 and time.monotonic() < deadline:
            try:
                answer = sock.recv(65536)
                break
            except BlockingIOError:
                pass
            try:
                sent += sock.send(b"a" * 65536)
            except BlockingIOError:
                time.sleep(0.01)
            except (BrokenPipeError, ConnectionResetError):
                break
        assert answer.startswith(b"HTTP/1.1 431 "), (sent, answer[:200])
        assert sent < 50_000_000, sent  # the limit plus what the sockets buffer
    assert httpx.post(f"{server.url}/score", json={"user": "u1", "items": ["i1"]}).status_code == 200
    log = server.log.read_text()
    assert "Traceback" not in log and "Invalid HTTP request" not in log, log[-2000:]


def closed_after(sock: socket.socket, drip: bytes = b"", within: float = 10.0) -> tuple[float, bytes]:
    """Seconds until the server closed ``sock`` (sending ``drip`` every 0.2 s meanwhile), and what it said."""
    started, said = time.monotonic(), b""
    sock.settimeout(0.2)
    while time.monotonic() - started < within:
        try:
            data = sock.recv(65536)
            if not data:
                return time.monotonic() - started, said
            said += data
        except TimeoutError:
            if drip:
                sock.sendall(drip)
        except ConnectionResetError:
            return time.monotonic() - started, said
    return time.monotonic() - started, said


def test_a_head_that_does_not_come_in_time_is_closed(server: Served) -> None:
    """Found by the tour: a connection that sent nothing, or a head a header every 0.2 s (slowloris),
    was held for good (40 s seen): uvicorn's keep-alive timeout stops at a request's first byte and
    starts after its response, and no server process closes a connection that sent nothing.
    """
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as idle:
        seconds, said = closed_after(idle)
        assert said == b"" and HEADER_TIMEOUT_S <= seconds + 0.1 < HEADER_TIMEOUT_S + 2, seconds
    with socket.create_connection((host, int(port))) as slow:
        slow.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\n")
        seconds, said = closed_after(slow, drip=b"X-A: b\r\n")
        assert said.startswith(b"HTTP/1.1 408 "), said
        assert "STREAMREC_SERVING__HEADER_TIMEOUT_S" in orjson.loads(said.split(b"\r\n\r\n", 1)[1])["error"]
        assert seconds < HEADER_TIMEOUT_S + 2, seconds
    # a kept-alive connection: its next request, a while after the first, is answered
    with httpx.Client(timeout=5) as client:
        for _ in range(2):
            response = client.post(f"{server.url}/score", json={"user": "u1", "items": ["i1"]})
            assert response.status_code == 200, response.text
            time.sleep(HEADER_TIMEOUT_S * 0.8)
