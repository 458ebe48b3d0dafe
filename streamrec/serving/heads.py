"""Bounds on each request's head (its request line and headers): its bytes and its time.

``STREAMREC_SERVING__MAX_HEADER_BYTES`` and ``STREAMREC_SERVING__HEADER_TIMEOUT_S``.

uvicorn runs serve on httptools (llhttp), which bounds neither the request line nor the
headers: a 200 KB header was read and answered 200, and a client sending one header without end
was read for as long as it sent (114 MB in 20 s, held in memory). uvicorn's other parser, h11,
stops at ``h11_max_incomplete_event_size`` (16 KiB by default) with a 400 that names nothing;
uvicorn offers nothing for httptools (its issue 157; PRs 1684 and 2019 were closed unmerged).

`HeadBoundProtocol` is uvicorn's httptools protocol counting each request's head as it is
parsed: the request line's bytes as they come, each header's once complete, and every chunk
read while a head is still open (so one endless header is counted too). Past the limit, the
request gets 431 (414 when its request line alone passes it) with a JSON reason naming the
setting and ``Connection: close``; the server stops parsing, says no more, and reads and drops
what the client still sends for up to `LINGER_S`, so the client sees the answer rather than a
reset. The limit travels in uvicorn's own ``h11_max_incomplete_event_size``, the bound of the
same head in its h11 parser.

uvicorn bounds no head's time either: its keep-alive timeout stops at a request's first byte and
starts after its response, and a connection that sends nothing is held for good, so a client
sending a header now and then (slowloris), or opening connections and sending nothing, held
them without end. A head not whole ``header_timeout_s`` after the connection opened or the
request's first byte came gets 408 (a connection that sent nothing is closed without a word).
The timeout rides in `ServerConfig`, which pickles to `streamrec serve --processes N`'s server
processes as uvicorn's own does.

A response the app ends with ``Connection: close`` before the request's body was read whole (a
413, `streamrec.serving.http`) lingers the same way: uvicorn closed at once, with the body
unread, and a client that sends its body whole before reading (a raw socket sending 1 MB) got
a broken pipe or a reset instead of the 413.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httptools
import orjson
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

logger = logging.getLogger(__name__)

# How long a refused connection's further bytes are read and dropped before it is closed: a
# client still sending its head when the answer goes out reads it after its send, where closing
# with unread bytes would reset the connection under it. A second covers a loopback or LAN
# client sending megabytes; a client that sends on is cut off then.
LINGER_S = 1.0
# A header's bytes beyond its name and value: ": " and CRLF.
_HEADER_OVERHEAD = 4
_REASONS = {408: b"Request Timeout", 414: b"URI Too Long", 431: b"Request Header Fields Too Large"}


class ServerConfig(uvicorn.Config):
    """uvicorn's configuration and the time a request's head may take (`HeadBoundProtocol`)."""

    def __init__(self, app: Any, header_timeout_s: float, **options: Any) -> None:
        """As uvicorn's, with ``header_timeout_s``."""
        super().__init__(app, **options)
        self.header_timeout_s = header_timeout_s


class _LingeringClose(asyncio.Transport):
    """What a request's response cycle writes to: the connection's transport, its close lingering.

    Closed while the request's body is still coming, the connection is closed as a refused head's
    (`HeadBoundProtocol._linger`); otherwise at once, as uvicorn does. Its cost, measured with
    a stub transport: 0.45 us a request (made, two writes, two checks), against milliseconds of
    model time; so it wraps every request rather than guess which body is still coming.
    """

    def __init__(self, protocol: HeadBoundProtocol, cycle: Any) -> None:
        super().__init__()
        self._protocol, self._cycle = protocol, cycle

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Write to the connection."""
        self._protocol.transport.write(data)

    def is_closing(self) -> bool:
        """Whether the connection is closing (a lingering one is not yet)."""
        return self._protocol.transport.is_closing()

    def close(self) -> None:
        """Close the connection, after `LINGER_S` when the request's body is still coming."""
        if self._cycle.more_body and not self._protocol.transport.is_closing():
            self._protocol._linger()
        else:
            self._protocol.transport.close()


class _HeadTooLarge(Exception):
    """Raised from a parser callback to stop parsing a head past the limit."""


class HeadBoundProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, each request's head bounded by the config's limit."""

    def __init__(self, config: ServerConfig, server_state: Any, app_state: Any, _loop: Any = None) -> None:
        """As uvicorn's; the limits are ``config.h11_max_incomplete_event_size`` and ``header_timeout_s``."""
        super().__init__(config, server_state, app_state, _loop)
        self.max_head_bytes: int = config.h11_max_incomplete_event_size or 0
        self.header_timeout_s = config.header_timeout_s
        self._timer: asyncio.TimerHandle | None = None  # the head's deadline, while one is awaited
        self._head: int | None = None  # bytes of the open head parsed so far; None between heads
        self._url = 0  # of those, the request line's target
        self._read = 0  # bytes of the chunks read wholly within the open head
        self._begun = 0  # requests begun on this connection: a chunk may end one and begin the next
        self._refused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """A connection: its first request's head is awaited from now."""
        super().connection_made(transport)  # type: ignore[arg-type]  # uvicorn's takes a Transport
        self._time_head()

    def connection_lost(self, exc: Exception | None) -> None:
        """The connection closed: no head is awaited."""
        self._untime_head()
        super().connection_lost(exc)

    def _time_head(self) -> None:
        if self._timer is None:
            self._timer = self.loop.call_later(self.header_timeout_s, self._head_late)

    def _untime_head(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_late(self) -> None:
        self._timer = None
        if self._refused or self.transport.is_closing():
            return
        if self._head is None:  # nothing of a request came: closed, as keep-alive's timeout does
            self.transport.close()
            return
        self._refuse(408, f"request line and headers not whole within {self.header_timeout_s:g} s "
                     "(STREAMREC_SERVING__HEADER_TIMEOUT_S)")

    def on_message_begin(self) -> None:
        """A request begins: its head is open, and timed from here if it was not already."""
        super().on_message_begin()
        self._time_head()
        self._head, self._url, self._read = 0, 0, 0
        self._begun += 1

    def on_url(self, url: bytes) -> None:
        """Part of the request line's target (a long one comes in parts)."""
        super().on_url(url)
        self._url += len(url)
        self._counted(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        """One complete header."""
        super().on_header(name, value)
        self._counted(len(name) + len(value) + _HEADER_OVERHEAD)

    def on_headers_complete(self) -> None:
        """The head is whole: the request goes to the app, its close lingering (`_LingeringClose`)."""
        self._head = None
        self._untime_head()
        super().on_headers_complete()
        if self.cycle is not None:
            self.cycle.transport = _LingeringClose(self, self.cycle)

    def _counted(self, size: int) -> None:
        if self._head is not None:
            self._head += size
            if self._head > self.max_head_bytes:
                raise _HeadTooLarge

    def data_received(self, data: bytes) -> None:
        """Parse ``data``; refuse the request whose head passes the limit."""
        if self._refused:  # lingering: dropped
            return
        self._unset_keepalive_if_required()
        open_before = self._begun if self._head is not None else None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, _HeadTooLarge):
                self._too_large()
            else:  # as uvicorn's
                self._invalid()
            return
        except httptools.HttpParserUpgrade:  # as uvicorn's
            self._upgrade()
            return
        if self._head is not None and open_before == self._begun:  # all head: an endless header too
            self._read += len(data)
            if self._read > self.max_head_bytes:
                self._too_large()

    def _too_large(self) -> None:
        status = 414 if self._url > self.max_head_bytes else 431
        what = "request line" if status == 414 else "request line and headers"
        reason = f"{what} over {self.max_head_bytes} bytes (STREAMREC_SERVING__MAX_HEADER_BYTES)"
        self._refuse(status, f"{reason}: send less, or raise the setting")

    def _refuse(self, status: int, reason: str) -> None:
        """Answer ``status`` with ``reason``, stop reading requests, close after `LINGER_S`."""
        self._refused = True
        self._untime_head()
        body = orjson.dumps({"error": reason})
        head = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS[status])]
        head += [name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers]
        head += [
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
        ]
        logger.debug("request refused status=%d reason=%s", status, reason)
        self.transport.write(b"".join(head) + body)
        self._linger()

    def _linger(self) -> None:
        """Say no more, drop what the client still sends and close after `LINGER_S`."""
        self._refused = True
        self._untime_head()
        self._unset_keepalive_if_required()
        self.flow.resume_reading()  # paused by a body read in part: its bytes are read and dropped
        if self.transport.can_write_eof():
            self.transport.write_eof()  # said all: the client reads the answer and closes
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()

    def _invalid(self) -> None:
        msg = "Invalid HTTP request received."
        self.logger.warning(msg)
        self.send_400_response(msg)

    def _upgrade(self) -> None:
        if self._should_upgrade():
            self.handle_websocket_upgrade()
        else:
            self._unsupported_upgrade_warning()
