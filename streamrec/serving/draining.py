"""A stopping server's listening socket drained before it closes: no queued connection reset.

The kernel completes a client's handshake and queues the connection before a server process
accepts it, and the client sends its request at once. A listening socket closed with
connections in its queue resets them: the client, its request sent, cannot tell whether it was
served. ``streamrec serve --processes 2`` stopped under load reset dozens a stop (its supervisor
holds the socket open until the workers have shut down, so connections queued all that while).

So a stop first has the socket refuse new connections and waits for the server processes,
still serving, to accept those queued; only then are they asked to shut down (uvicorn's: they
stop accepting, answer what they hold, and close). Linux keeps a listening socket listening
until its last descriptor closes, and offers no way to stop one from queueing new connections
but for the socket filter (``SO_ATTACH_FILTER``) set here: it drops every new connection's
first packet (a SYN without ACK), so no new connection is queued, while those already in their
handshake complete. A client whose SYN is dropped sends it again a second later and is refused
(the socket closed by then): it sent no request. The filter is the socket's, shared by every
process serving on it, so the supervisor sets it once for all.

The supervisor of several processes (`DrainingSupervisor`) also says, at WARNING, when one of
them dies and is replaced.
"""

from __future__ import annotations

import ctypes
import logging
import signal
import socket
import struct
import sys
import time

import uvicorn
from uvicorn.supervisors import Multiprocess

from streamrec.serving.heads import HeadBoundProtocol

logger = logging.getLogger(__name__)

# setsockopt(2)'s SO_ATTACH_FILTER, and TCP_INFO's fields read here (linux/tcp.h): on a listening
# socket, tcpi_unacked is the number of connections queued for accept.
_SO_ATTACH_FILTER = 26
_TCP_INFO = 11
_TCPI_UNACKED_OFFSET = 24
# Classic BPF, run on each packet to the listening socket from its TCP header: load the flags
# byte; SYN without ACK (a new connection) drops it, anything else (a handshake's last ACK) passes.
_BPF_LD_B_ABS, _BPF_ALU_AND_K, _BPF_JEQ_K, _BPF_RET_K = 0x30, 0x54, 0x15, 0x06
_TCP_FLAGS, _SYN, _ACK = 13, 0x02, 0x10
_REFUSE_NEW = (
    (_BPF_LD_B_ABS, 0, 0, _TCP_FLAGS),
    (_BPF_ALU_AND_K, 0, 0, _SYN | _ACK),
    (_BPF_JEQ_K, 0, 1, _SYN),
    (_BPF_RET_K, 0, 0, 0),  # drop
    (_BPF_RET_K, 0, 0, 0xFFFF_FFFF),  # pass, whole
)
# How long the queue must read empty before it is taken as drained: a handshake begun before the
# filter was set ends with the client's ACK one round trip later (well under this in a data centre).
SETTLE_S = 0.2
# The most a stop waits for the queue to drain: server processes that stopped accepting (hung,
# or dead) must not hold the stop forever.
DRAIN_TIMEOUT_S = 5.0
_POLL_S = 0.01


def refuse_new_connections(sock: socket.socket) -> bool:
    """Have listening ``sock`` queue no new connection from now on, in every process sharing it.

    Returns False where it cannot (not Linux, or the kernel refused the filter): the stop then
    goes on as before.
    """
    if not sys.platform.startswith("linux"):
        return False
    code = b"".join(struct.pack("HBBI", *op) for op in _REFUSE_NEW)
    program = ctypes.create_string_buffer(code)
    fprog = struct.pack("HL", len(_REFUSE_NEW), ctypes.addressof(program))
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, fprog)
    except OSError as exc:
        logger.warning("cannot stop the listening socket queueing connections: %s", exc)
        return False
    return True


def queued(sock: socket.socket) -> int | None:
    """Connections queued on listening ``sock`` for accept; None where it cannot be read."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 104)
    except OSError:
        return None
    if len(info) < _TCPI_UNACKED_OFFSET + 4:
        return None
    (count,) = struct.unpack_from("I", info, _TCPI_UNACKED_OFFSET)
    return int(count)


def drained(sock: socket.socket) -> float | None:
    """The seconds until ``sock``'s queue read empty for `SETTLE_S`, or None after `DRAIN_TIMEOUT_S`.

    Another thread or process accepts meanwhile; this one only looks.
    """
    start = time.monotonic()
    empty_since: float | None = None
    while (now := time.monotonic()) - start < DRAIN_TIMEOUT_S:
        count = queued(sock)
        if count is None:
            return 0.0
        if count:
            empty_since = None
        elif empty_since is None:
            empty_since = now
        elif now - empty_since >= SETTLE_S:
            return empty_since - start
        time.sleep(_POLL_S)
    return None


def drain(sock: socket.socket) -> None:
    """Refuse new connections on ``sock`` and wait until those queued are accepted (by others)."""
    if not refuse_new_connections(sock):
        return
    took = drained(sock)
    if took is None:
        logger.warning(
            "stopping with %s connections still queued after %.0f s: the server processes accept none",
            queued(sock), DRAIN_TIMEOUT_S,
        )
    else:
        logger.debug("listening socket drained in %.3f s", took)


class StoppingProtocol(HeadBoundProtocol):
    """A connection that, once its server stops, answers one more request and closes after it."""

    _stopping = False

    def shutdown(self) -> None:
        """The server stops: the request in hand, or the next on an idle connection, is the last.

        An idle connection stays open for the request its client may have sent already; it
        closes after its answer, or at the keep-alive timeout when nothing comes.
        """
        self._stopping = True
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.keep_alive = False
        elif self.timeout_keep_alive_task is None:  # no request yet: timed from now
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    def on_headers_complete(self) -> None:
        """A request: answered with ``Connection: close`` once the server stops."""
        super().on_headers_complete()
        if self._stopping and self.cycle is not None:
            self.cycle.keep_alive = False


class DrainingServer(uvicorn.Server):
    """uvicorn's server in one process, its listening sockets drained as it stops."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Drain, then uvicorn's shutdown: stop accepting, answer what is held, close."""
        import asyncio

        for sock in sockets or []:  # this process's loop accepts meanwhile
            await asyncio.to_thread(drain, sock)
        await super().shutdown(sockets)


class DrainingSupervisor(Multiprocess):
    """uvicorn's supervisor of several server processes: their socket drained, their deaths said.

    The shared socket is drained before they are asked to stop; one that dies is said at WARNING
    (uvicorn says it at INFO, on its own logger).
    """

    def keep_subprocess_alive(self) -> None:
        """uvicorn's: start others in place of the server processes that ended; then say which, and how."""
        before = list(self.processes)
        super().keep_subprocess_alive()
        for old, new in zip(before, self.processes, strict=True):
            if new is not old:  # ended (or hung, and killed by uvicorn), and replaced
                code = old.process.exitcode or 0
                how = f"killed by {_signal_name(-code)}" if code < 0 else f"with exit code {code}"
                logger.warning("server process %s ended, %s: started %s in its place", old.pid, how, new.pid)

    def terminate_all(self) -> None:
        """Drain the shared socket while the workers accept, then ask each to shut down."""
        for sock in self.sockets:
            drain(sock)
        super().terminate_all()


def _signal_name(number: int) -> str:
    """``SIGKILL`` for 9; the number where it names no signal."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
