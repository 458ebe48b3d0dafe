"""``up``/``down``/``status`` and ``local_services`` against the real binaries on free ports."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from confluent_kafka.admin import AdminClient

from streamrec.config import KafkaConfig, RedisStoreConfig, ServicesConfig
from streamrec.errors import ServiceError
from streamrec.kafka.topics import create_topics
from streamrec.local import launch
from streamrec.local.launch import local_services
from streamrec.local.ports import free_ports
from streamrec.local.probes import kafka_healthy, redis_healthy
from streamrec.local.processes import pid_alive, read_pid
from streamrec.local.services import ServiceState, down, status, up
from tests.support import wait_for

pytestmark = pytest.mark.usefixtures("service_binaries")


@pytest.fixture
def cfg(tmp_path: Path) -> Iterator[ServicesConfig]:
    """Services config on free ports with a private state dir; whatever is left is stopped."""
    kafka_port, redis_port = free_ports("127.0.0.1", 2)
    config = ServicesConfig(
        kafka_port=kafka_port,
        redis_port=redis_port,
        state_dir=tmp_path / "state",
        start_timeout_s=10,
    )
    yield config
    down(config)


@pytest.fixture
def listener() -> Iterator[int]:
    """A port held by a listening socket, like one a stray server would hold."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _redis_asked(cfg: ServicesConfig) -> tuple[int, int]:
    """(connections Redis accepted, CONFIG GETs it ran) so far, this client's included."""
    client = redis.Redis(cfg.host, cfg.redis_port, decode_responses=True)
    try:
        stats, commands = client.info("stats"), client.info("commandstats")
        configs = commands.get("cmdstat_config|get", {}).get("calls", 0)
        return int(stats["total_connections_received"]), int(configs)
    finally:
        client.close()


def test_status_only_pings_redis_and_up_asks_what_it_keeps_on_one_connection(cfg: ServicesConfig) -> None:
    """Review: each ``status`` opened a second client to ask Redis what it keeps, which only
    ``up`` says. Now ``status`` pings, and ``up`` asks (CONFIG GET) in place of the ping.
    """
    up(cfg)
    connections, configs = _redis_asked(cfg)
    status(cfg)
    # one raw TCP check (tcp_reachable) and one client, then this count's own client
    assert _redis_asked(cfg) == (connections + 3, configs)
    connections, configs = _redis_asked(cfg)
    assert up(cfg)[1].data_dir is None
    assert _redis_asked(cfg) == (connections + 2, configs + 2)  # no raw check: CONFIG GET x2


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_up_status_down(cfg: ServicesConfig) -> None:
    started = up(cfg)
    assert [(s.name, s.state) for s in started] == [
        ("kafka", ServiceState.STARTED),
        ("redis", ServiceState.STARTED),
    ]
    pids = {s.name: s.pid for s in started if s.pid is not None}
    assert read_pid(cfg.state_dir / "kafka.pid") == pids["kafka"]
    assert read_pid(cfg.state_dir / "redis.pid") == pids["redis"]
    assert kafka_healthy(cfg.host, cfg.kafka_port)
    assert redis_healthy(cfg.host, cfg.redis_port)

    again = up(cfg)
    assert [(s.state, s.pid) for s in again] == [
        (ServiceState.RUNNING, pids[s.name]) for s in again
    ]
    assert [s.state for s in status(cfg)] == [ServiceState.RUNNING, ServiceState.RUNNING]

    assert [(s.name, s.pid, s.state) for s in down(cfg)] == [
        (name, pids[name], ServiceState.STOPPED) for name in ("kafka", "redis")
    ]
    assert not (cfg.state_dir / "kafka.pid").exists()
    assert not (cfg.state_dir / "redis.pid").exists()
    assert not any(pid_alive(pid) for pid in pids.values())
    assert [s.state for s in status(cfg)] == [ServiceState.STOPPED, ServiceState.STOPPED]
    assert [s.pid for s in down(cfg)] == [None, None]


@pytest.mark.parametrize(
    ("service", "env_var"),
    [("kafka", "STREAMREC_SERVICES__KAFKA_PORT"), ("redis", "STREAMREC_SERVICES__REDIS_PORT")],
)
def test_port_taken_is_named(
    cfg: ServicesConfig, listener: int, service: str, env_var: str
) -> None:
    taken = cfg.model_copy(update={f"{service}_port": listener})
    with pytest.raises(ServiceError, match=rf"port {listener}\b.*{env_var}"):
        up(taken)
    assert not list(taken.state_dir.glob("*.pid")), "nothing may start when a port is taken"
    assert [s.state for s in status(taken) if s.name == service] == [ServiceState.EXTERNAL]


def test_local_services_port_taken(listener: int) -> None:
    with pytest.raises(ServiceError, match=rf"port {listener}\b"):
        with local_services(kafka_port=listener):
            pass


def test_stale_pid_files_are_tolerated(cfg: ServicesConfig) -> None:
    cfg.state_dir.mkdir(parents=True)
    (cfg.state_dir / "kafka.pid").write_text(f"{_dead_pid()}\n")
    (cfg.state_dir / "redis.pid").write_text(f"{os.getpid()}\n")  # alive, but not a redis

    assert [(s.pid, s.state) for s in status(cfg)] == [(None, ServiceState.STOPPED)] * 2
    assert [s.pid for s in down(cfg)] == [None, None]
    assert not list(cfg.state_dir.glob("*.pid"))

    (cfg.state_dir / "kafka.pid").write_text("garbage\n")
    (cfg.state_dir / "redis.pid").write_text(f"{os.getpid()}\n")
    assert [s.state for s in up(cfg)] == [ServiceState.STARTED, ServiceState.STARTED]
    assert read_pid(cfg.state_dir / "redis.pid") != os.getpid()
    assert all(s.pid is not None for s in down(cfg))


def test_status_shows_a_crashed_service_where_up_started_it(cfg: ServicesConfig) -> None:
    # Found by a tour: after `up --redis-port 16380` and a kill -9 of that Redis, `streamrec status`
    # (without the port flags) showed `redis 127.0.0.1:6380 stopped`, the default port, and would
    # have shown whatever another user's Redis there answered as `external`.
    up(cfg)
    elsewhere = free_ports("127.0.0.1", 2)
    plain = cfg.model_copy(update={"kafka_port": elsewhere[0], "redis_port": elsewhere[1]})
    redis_pid = read_pid(cfg.state_dir / "redis.pid")
    assert redis_pid is not None
    os.kill(redis_pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(redis_pid), timeout_s=10, what="the killed redis gone")
    found = {s.name: s for s in status(plain)}
    assert found["redis"].address == f"{cfg.host}:{cfg.redis_port}"
    assert (found["redis"].pid, found["redis"].state) == (None, ServiceState.STOPPED)
    assert found["kafka"].address == f"{cfg.host}:{cfg.kafka_port}"
    # `up` again, on the ports it is given now, says where it started it
    started = {s.name: s for s in up(plain)}
    assert started["redis"].address == f"{plain.host}:{plain.redis_port}"
    assert started["redis"].state is ServiceState.STARTED
    assert [s.state for s in status(plain)] == [ServiceState.RUNNING] * 2
    down(plain)


def test_start_failure_quotes_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        launch, "redis_command", lambda binary, *_: [binary, "--no-such-directive", "1"]
    )
    (port,) = free_ports()
    with pytest.raises(ServiceError, match=r"(?s)redis exited during start-up.*no-such-directive"):
        launch.start_redis("127.0.0.1", port, tmp_path)


def test_local_services_run_and_stop(tmp_path: Path) -> None:
    with local_services(state_dir=tmp_path) as running:
        create_topics(running.bootstrap_servers, {"t1": 3, "t2": 1})
        create_topics(running.bootstrap_servers, {"t1": 3})  # already there: fine
        with redis.Redis.from_url(running.redis_url) as client:
            assert client.ping()
        procs = (running.kafka, running.redis)
    assert not any(p.alive() for p in procs)
    assert (tmp_path / "kafka.log").exists() and (tmp_path / "redis.log").exists()


def test_create_topics_without_broker_is_a_service_error() -> None:
    (port,) = free_ports()
    with pytest.raises(ServiceError, match=rf"could not create topics on 127.0.0.1:{port}"):
        create_topics(f"127.0.0.1:{port}", {"t": 1}, timeout_s=0.5)


def test_fixtures(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, redis_client: redis.Redis
) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_config.bootstrap_servers})
    topics = admin.list_topics(timeout=5).topics
    for name in (kafka_config.events_topic, kafka_config.dlq_topic, kafka_config.samples_topic):
        assert len(topics[name].partitions) == 3
    assert redis_client.dbsize() == 0
    redis_client.set(f"{store_config.key_prefix}:k", b"v")
    with redis.Redis.from_url(store_config.url) as client:
        assert client.get(f"{store_config.key_prefix}:k") == b"v"
