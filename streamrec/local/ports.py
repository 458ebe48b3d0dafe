"""TCP port helpers for the local services: free ports, in-use checks, addresses."""

from __future__ import annotations

import contextlib
import socket

from streamrec.errors import ServiceError


def address(host: str, port: int) -> str:
    """``host:port`` as Kafka and Redis clients expect it (IPv6 hosts in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _family(host: str) -> socket.AddressFamily:
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ServiceError(f"cannot resolve service host {host!r}: {exc}") from exc
    return infos[0][0]


def free_ports(host: str = "127.0.0.1", count: int = 1) -> list[int]:
    """``count`` distinct ports the kernel reports free on ``host`` right now.

    The sockets are held open together so the ports differ; another process may still take one
    before the caller binds it, which the service start-up then reports.
    """
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(_family(host), socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def free_port(host: str = "127.0.0.1") -> int:
    """One port that is free on ``host`` right now."""
    return free_ports(host, 1)[0]


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now.

    Binds with ``SO_REUSEADDR`` like the servers do, so a port held only by ``TIME_WAIT``
    connections counts as free while one with a listener does not.
    """
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return not tcp_reachable(host, port, timeout_s=0.2)


def tcp_reachable(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def ensure_port_free(host: str, port: int, *, service: str, env_var: str, flag: str) -> None:
    """Raise ServiceError naming the port and the setting to change when it is taken."""
    if not port_is_free(host, port):
        raise ServiceError(
            f"{service} cannot start: port {port} on {host} is already in use. Stop whatever "
            f"holds it, or choose another port with {env_var}=<port> (or {flag} <port>)."
        )
