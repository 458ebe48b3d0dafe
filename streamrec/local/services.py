"""Local development services: ``up``/``down``/``status`` of a detached broker and Redis.

``up`` starts the Tansu Kafka broker (memory storage) and a redis-server in the background,
records their pids in ``state_dir/{kafka,redis}.pid``, the addresses they serve on in
``state_dir/{kafka,redis}.address`` (so that ``status``, ``up`` and ``down`` find them there
whatever ports those are given) and their output in ``state_dir/{kafka,redis}.log``; ``down``
stops them. The broker keeps nothing once stopped; Redis keeps nothing either, unless
``data_dir`` is set: then an append-only file there keeps its data across restarts. Tests and
the demo use ``streamrec.local.launch.local_services()`` instead, which owns both for a
``with`` block.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from redis import RedisError

from streamrec.config import ServicesConfig
from streamrec.errors import ServiceError
from streamrec.fileio import write_atomic
from streamrec.local.launch import KAFKA, REDIS, ServiceSpec, start_broker, start_redis
from streamrec.local.ports import address, ensure_port_free, tcp_reachable
from streamrec.local.probes import HEALTH, PROBE_TIMEOUT_S, redis_keeps
from streamrec.local.processes import ManagedProcess, pid_matches, read_pid, stop_pid, write_pid

logger = logging.getLogger(__name__)

_SPECS = (KAFKA, REDIS)


class ServiceState(StrEnum):
    """What ``up`` and ``status`` found."""

    STARTED = "started"  # ``up`` started it just now
    RUNNING = "running"  # ours (pid file), alive and answering
    STOPPED = "stopped"  # not running
    UNHEALTHY = "unhealthy"  # ours and alive, but not answering on the configured address
    EXTERNAL = "external"  # not ours, but something answers on the port


@dataclass(frozen=True)
class ServiceStatus:
    """One service as ``up``/``status`` report it."""

    name: str
    address: str
    pid: int | None
    state: ServiceState
    # Redis's: where it keeps its append-only file (None: it keeps nothing), as it runs
    data_dir: Path | None = None


def _port(cfg: ServicesConfig, spec: ServiceSpec) -> int:
    return int(getattr(cfg, f"{spec.name}_port"))


def _pid_file(cfg: ServicesConfig, spec: ServiceSpec) -> Path:
    return cfg.state_dir / f"{spec.name}.pid"


def _address_file(cfg: ServicesConfig, spec: ServiceSpec) -> Path:
    return cfg.state_dir / f"{spec.name}.address"


def _address_of(cfg: ServicesConfig, spec: ServiceSpec) -> tuple[str, int]:
    """Where to look for the service: where ``up`` last started ours, else the configured address.

    ``up`` records the address beside the pid and ``down`` removes both, so a service of ours
    that died is still looked for where it ran, not on a port another user's service may hold.
    """
    try:
        host, _, port = _address_file(cfg, spec).read_text().strip().rpartition(" ")
        return host, int(port)
    except (OSError, ValueError):
        return cfg.host, _port(cfg, spec)


def _forget(cfg: ServicesConfig, spec: ServiceSpec) -> None:
    """Remove the service's pid and address files."""
    _pid_file(cfg, spec).unlink(missing_ok=True)
    _address_file(cfg, spec).unlink(missing_ok=True)


def _live_pid(cfg: ServicesConfig, spec: ServiceSpec) -> int | None:
    """The pid-file pid if that process is alive and is this service, else None."""
    path = _pid_file(cfg, spec)
    pid = read_pid(path)
    if pid is not None and pid_matches(pid, spec.marker):
        return pid
    if path.exists():
        logger.info("service=%s pid_file=%s stale pid=%s", spec.name, path, pid)
    return None


def _status(cfg: ServicesConfig, spec: ServiceSpec, *, keeps: bool = False) -> ServiceStatus:
    """Ours (by its pid file), or whatever answers, where ``up`` last started ours, else where configured.

    ``keeps``: ask our Redis where it keeps its data (``data_dir``), its answer the health probe.
    """
    pid = _live_pid(cfg, spec)
    host, port = _address_of(cfg, spec)
    kept = None
    if pid is not None and keeps and spec is REDIS:
        try:
            kept, state = redis_keeps(host, port), ServiceState.RUNNING
        except RedisError:
            state = ServiceState.UNHEALTHY
    elif pid is not None:
        healthy = HEALTH[spec.name](host, port, PROBE_TIMEOUT_S)
        state = ServiceState.RUNNING if healthy else ServiceState.UNHEALTHY
    else:
        state = ServiceState.EXTERNAL if tcp_reachable(host, port) else ServiceState.STOPPED
    return ServiceStatus(spec.name, address(host, port), pid, state, kept)


def _start(spec: ServiceSpec, cfg: ServicesConfig) -> ManagedProcess:
    """Start one service detached, Redis with its data directory if ``cfg`` names one."""
    port = _port(cfg, spec)
    if spec is REDIS:
        return start_redis(
            cfg.host, port, cfg.state_dir, timeout_s=cfg.start_timeout_s, detached=True,
            data_dir=cfg.data_dir,
        )
    return start_broker(cfg.host, port, cfg.state_dir, timeout_s=cfg.start_timeout_s, detached=True)


def status(cfg: ServicesConfig) -> list[ServiceStatus]:
    """The state of each service under ``cfg.state_dir``; changes nothing."""
    return [_status(cfg, spec) for spec in _SPECS]


def up(cfg: ServicesConfig, ports_given: Collection[str] = ()) -> list[ServiceStatus]:
    """Start whichever service is not already running, detached, and wait until both are healthy.

    A service whose pid file names a live, healthy process is reported as running, wherever it
    runs, unless ``ports_given`` names it (its port was asked for) and it runs on another. Both
    ports are checked before anything starts; if one start fails, what this call started is
    stopped.
    """
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    found = [_status(cfg, spec, keeps=True) for spec in _SPECS]
    for spec, st in zip(_SPECS, found, strict=True):
        if st.state is ServiceState.UNHEALTHY:
            raise ServiceError(
                f"{spec.name} (pid {st.pid} in {_pid_file(cfg, spec)}) runs but does not answer "
                f"on {st.address}; run `streamrec down` first"
            )
        if spec.name in ports_given and st.state is ServiceState.RUNNING:
            _check_address(cfg, spec, st)
        if spec is REDIS and st.state is ServiceState.RUNNING:
            _check_keeps(cfg, st)
        if st.state is not ServiceState.RUNNING:
            ensure_port_free(
                cfg.host,
                _port(cfg, spec),
                service=spec.name,
                env_var=spec.port_env,
                flag=spec.port_flag,
            )
    started: list[tuple[ServiceSpec, ManagedProcess]] = []
    result = []
    try:
        for spec, st in zip(_SPECS, found, strict=True):
            if st.state is ServiceState.RUNNING:
                result.append(st)
                continue
            _forget(cfg, spec)  # stale, if any
            proc = _start(spec, cfg)
            write_atomic(_address_file(cfg, spec), f"{cfg.host} {_port(cfg, spec)}\n".encode())
            write_pid(_pid_file(cfg, spec), proc.pid)
            started.append((spec, proc))
            kept = cfg.data_dir.resolve() if spec is REDIS and cfg.data_dir is not None else None
            where = address(cfg.host, _port(cfg, spec))
            result.append(ServiceStatus(spec.name, where, proc.pid, ServiceState.STARTED, kept))
    except BaseException:  # an interrupted or failed up leaves nothing behind
        for spec, proc in started:
            proc.stop()
            _forget(cfg, spec)
        raise
    return result


def _check_address(cfg: ServicesConfig, spec: ServiceSpec, running: ServiceStatus) -> None:
    """Refuse a port other than the one the ``running`` service listens on.

    Raises:
        ServiceError: it runs elsewhere (``up`` would have shown it there, ignoring the port).
    """
    asked = address(cfg.host, _port(cfg, spec))
    if running.address != asked:
        raise ServiceError(
            f"{spec.name} already runs (pid {running.pid}) on {running.address}, not on {asked}: run "
            f"`streamrec down` first to move it, or name its port ({spec.port_flag} "
            f"{running.address.rpartition(':')[2]})"
        )


def _check_keeps(cfg: ServicesConfig, running: ServiceStatus) -> None:
    """Refuse a ``data_dir`` other than the one the ``running`` Redis keeps in.

    Raises:
        ServiceError: it keeps nothing, or keeps elsewhere (``up`` would have said it keeps there).
    """
    kept = running.data_dir
    if cfg.data_dir is None or cfg.data_dir.resolve() == kept:
        return
    keeps = "nothing" if kept is None else f"in {kept}"
    raise ServiceError(
        f"redis already runs (pid {running.pid}) on {running.address} keeping {keeps}, not in "
        f"{cfg.data_dir}: run `streamrec down` first, then `streamrec up --data-dir {cfg.data_dir}`"
    )


def down(cfg: ServicesConfig, *, timeout_s: float = 10.0) -> list[ServiceStatus]:
    """Stop the services named by pid files and remove their files.

    Returns each service as stopped, on the address it ran on, with the pid stopped (None where
    none ran). A pid file whose process is gone, or is no longer this service, is just removed.
    """
    result = []
    for spec in _SPECS:
        pid = _live_pid(cfg, spec)
        ran_on = address(*_address_of(cfg, spec))
        if pid is not None:
            stop_pid(pid, spec.stop_signal, timeout_s)
            logger.info("service=%s pid=%s stopped", spec.name, pid)
        _forget(cfg, spec)
        result.append(ServiceStatus(spec.name, ran_on, pid, ServiceState.STOPPED))
    return result
