"""A stopping server answers a request sent on a kept-alive connection, with ``Connection: close``.

A client that keeps its connection alive and sends steadily sent its next request as the stop
closed the connection, idle between two requests: the request was lost (a raw keep-alive client,
6 of them sending steadily, lost 13 requests over 5 stops of ``streamrec serve``).
"""

from __future__ import annotations

import socket
import threading
import time

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from streamrec.config import ServingConfig
from streamrec.local.ports import free_port
from streamrec.serving.draining import DrainingServer
from streamrec.serving.processes import listen, server_config

REQUEST = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"
KEEP_ALIVE_S = 3.0  # the server's keep-alive timeout here: how long a stop waits on an idle connection,
# and how late after its first answer the kept connection may send its second (a loaded machine)


async def hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


def answer(sock: socket.socket) -> bytes:
    """The head of the response on ``sock`` and its 5-byte body, or what came before the end."""
    data = b""
    while not data.endswith(b"\r\n\r\nhello"):
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def test_a_request_on_a_kept_alive_connection_is_answered_while_the_server_stops() -> None:
    port = free_port()
    listening = listen("127.0.0.1", port)
    app = Starlette(routes=[Route("/", hello)])
    server = DrainingServer(server_config(app, ServingConfig(), timeout_keep_alive=KEEP_ALIVE_S))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listening]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    kept = socket.create_connection(("127.0.0.1", port), timeout=5)
    kept.sendall(REQUEST)
    assert b" 200 " in answer(kept)
    idle = socket.create_connection(("127.0.0.1", port), timeout=5)  # opened, never sends

    server.should_exit = True
    deadline = time.monotonic() + 10
    while listening.fileno() != -1 and time.monotonic() < deadline:  # until uvicorn's shutdown closed it
        time.sleep(0.01)
    time.sleep(0.2)  # past uvicorn's shutdown of each connection
    stopping = time.monotonic()
    kept.sendall(REQUEST)
    head = answer(kept)
    assert b" 200 " in head and b"connection: close" in head.lower()
    assert kept.recv(1) == b""  # then closed
    thread.join(KEEP_ALIVE_S + 5)  # the idle one closed by its keep-alive timeout at the latest
    assert not thread.is_alive()
    assert time.monotonic() - stopping < KEEP_ALIVE_S + 2
    assert idle.recv(1) == b""
    kept.close()
    idle.close()
