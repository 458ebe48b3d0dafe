"""Port helpers: free ports, in-use detection and the message that names the setting."""

from __future__ import annotations

import socket

import pytest

from streamrec.errors import ServiceError
from streamrec.local.ports import address, ensure_port_free, free_ports, port_is_free, tcp_reachable


def test_address_brackets_ipv6() -> None:
    assert address("127.0.0.1", 9092) == "127.0.0.1:9092"
    assert address("::1", 9092) == "[::1]:9092"


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports("127.0.0.1", 3)
    assert len(set(ports)) == 3
    assert all(port_is_free("127.0.0.1", p) for p in ports)


def test_a_listening_port_is_not_free() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert not port_is_free("127.0.0.1", port)
        assert tcp_reachable("127.0.0.1", port)
    assert port_is_free("127.0.0.1", port)
    assert not tcp_reachable("127.0.0.1", port)


def test_taken_port_message_names_port_and_setting() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(ServiceError) as info:
            ensure_port_free(
                "127.0.0.1",
                port,
                service="redis",
                env_var="STREAMREC_SERVICES__REDIS_PORT",
                flag="--redis-port",
            )
    message = str(info.value)
    assert f"port {port} on 127.0.0.1" in message
    assert "STREAMREC_SERVICES__REDIS_PORT=<port>" in message and "--redis-port" in message


def test_unresolvable_host_is_a_service_error() -> None:
    with pytest.raises(ServiceError, match="cannot resolve"):
        free_ports("no-such-host.invalid")
