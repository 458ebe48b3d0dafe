"""``streamrec up | status | down`` through the Typer commands."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from streamrec.cli.services import register
from streamrec.local.ports import free_ports

pytestmark = pytest.mark.usefixtures("service_binaries")


def _app() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


def test_up_status_down(tmp_path: Path) -> None:
    kafka_port, redis_port = free_ports("127.0.0.1", 2)
    flags = [
        "--kafka-port",
        str(kafka_port),
        "--redis-port",
        str(redis_port),
        "--state-dir",
        str(tmp_path),
    ]
    runner, app = CliRunner(), _app()
    try:
        result = runner.invoke(app, ["up", *flags])
        assert result.exit_code == 0, result.output
        assert result.stdout.count("started") == 2 and f"127.0.0.1:{kafka_port}" in result.stdout
        result = runner.invoke(app, ["status", *flags])
        assert result.exit_code == 0 and result.stdout.count("running") == 2
    finally:
        result = runner.invoke(app, ["down", *flags])
    assert result.exit_code == 0 and result.stdout.count("stopped") == 2
    assert not list(tmp_path.glob("*.pid"))


def test_taken_port_is_one_red_line_and_exit_1(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = CliRunner().invoke(
            _app(), ["up", "--kafka-port", str(port), "--state-dir", str(tmp_path)]
        )
    assert result.exit_code == 1
    assert result.stderr.startswith("error: kafka cannot start")
    assert len(result.stderr.splitlines()) == 1
    assert f"port {port}" in result.stderr and "STREAMREC_SERVICES__KAFKA_PORT" in result.stderr


def test_status_up_and_down_find_the_services_on_the_ports_up_started_them_on(tmp_path: Path) -> None:
    """Started with ports of their own, the services are found there by each later command that
    names the state directory alone: ``status`` called both unhealthy (it asked the default
    ports), ``up`` refused to go on, and ``down`` printed the default ports.
    """
    kafka_port, redis_port = free_ports("127.0.0.1", 2)
    state = ["--state-dir", str(tmp_path)]
    runner, app = CliRunner(), _app()
    ports = ["--kafka-port", str(kafka_port), "--redis-port", str(redis_port)]
    addresses = (f"127.0.0.1:{kafka_port}", f"127.0.0.1:{redis_port}")
    try:
        assert runner.invoke(app, ["up", *ports, *state]).exit_code == 0
        for command in ("status", "up"):
            result = runner.invoke(app, [command, *state])
            assert result.exit_code == 0, result.output
            assert result.stdout.count("running") == 2, result.stdout
            assert all(a in result.stdout for a in addresses), result.stdout
    finally:
        result = runner.invoke(app, ["down", *state])
    assert result.exit_code == 0 and result.stdout.count("stopped") == 2, result.output
    assert all(a in result.stdout for a in addresses), result.stdout
    assert not list(tmp_path.glob("*.pid")) and not list(tmp_path.glob("*.address"))


def test_up_again_says_what_the_running_redis_keeps_and_refuses_another_data_dir(tmp_path: Path) -> None:
    """Found from outside: ``up --data-dir D`` with a Redis already up keeping nothing said
    "Redis keeps in D (append-only file)", exit 0, and kept nothing.
    """
    kafka_port, redis_port = free_ports("127.0.0.1", 2)
    flags = ["--kafka-port", str(kafka_port), "--redis-port", str(redis_port), "--state-dir", str(tmp_path)]
    kept = tmp_path / "kept"
    runner, app = CliRunner(), _app()
    try:
        result = runner.invoke(app, ["up", *flags])
        assert result.exit_code == 0 and "Redis keeps nothing" in result.stdout, result.output
        result = runner.invoke(app, ["up", *flags, "--data-dir", str(kept)])
        assert result.exit_code == 1, result.output
        assert result.stderr.startswith("error: redis already runs") and "keeping nothing" in result.stderr
        assert "streamrec down" in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr
        assert not kept.exists()
        runner.invoke(app, ["down", *flags])
        result = runner.invoke(app, ["up", *flags, "--data-dir", str(kept)])
        assert result.exit_code == 0 and f"Redis keeps in {kept}" in result.stdout, result.output
        # run again without the flag, or with the same directory: it says what the running one keeps
        for again in ([], ["--data-dir", str(kept)]):
            result = runner.invoke(app, ["up", *flags, *again])
            assert result.exit_code == 0 and "running" in result.stdout, result.output
            assert f"Redis keeps in {kept}" in result.stdout, result.output
        result = runner.invoke(app, ["up", *flags, "--data-dir", str(tmp_path / "other")])
        assert result.exit_code == 1 and f"keeping in {kept}" in result.stderr, result.output
    finally:
        runner.invoke(app, ["down", *flags])


def test_up_again_with_another_port_refuses_it_rather_than_ignore_it(tmp_path: Path) -> None:
    """Found by a tour: ``up --kafka-port Q`` with the services already up on P reported them
    running on P, exit 0, without a word on Q; the commands then pointed at Q found nothing.
    ``up`` naming no port still finds them where they run.
    """
    kafka_port, redis_port, other = free_ports("127.0.0.1", 3)
    state = ["--state-dir", str(tmp_path)]
    runner, app = CliRunner(), _app()
    try:
        assert runner.invoke(app, ["up", "--kafka-port", str(kafka_port), "--redis-port", str(redis_port),
                                   *state]).exit_code == 0
        result = runner.invoke(app, ["up", "--kafka-port", str(other), *state])
        assert result.exit_code == 1, result.output
        said = " ".join(result.stderr.split())
        assert said.startswith("error: kafka already runs") and f"127.0.0.1:{kafka_port}" in said, said
        assert f"not on 127.0.0.1:{other}" in said and "streamrec down" in said, said
        assert len(result.stderr.splitlines()) == 1, result.stderr
        result = runner.invoke(app, ["up", "--redis-port", str(redis_port), *state])  # where it runs
        assert result.exit_code == 0 and result.stdout.count("running") == 2, result.output
    finally:
        runner.invoke(app, ["down", *state])
