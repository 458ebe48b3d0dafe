"""``streamrec serve`` on several processes sharing one port: one engine per core.

An engine (ONNX Runtime or Paddle Inference) scores one request at a time on one core (threads of one process
add nothing: measured in docs/operating/sizing.md), so a server uses a machine's cores with one
process each. The command binds the port once (`listen`) and uvicorn's supervisor starts
``processes`` workers on it (the kernel hands each connection to one of them) and restarts one
that dies. Each worker loads
the promoted version itself and follows the serving pointer on its own (`Scorer`), so a
promotion reaches every worker within ``poll_s`` with no request dropped; each has its own
admission limits (`streamrec.serving.admission`).

Workers are started fresh (multiprocessing's spawn: no predictor crosses a fork). They get the
configuration the command resolved (flags, env, file) through one environment variable, as
JSON, and build the same app as a single-process server. Each ends with the supervisor
(`streamrec.orphans`): killed outright, it would otherwise leave them serving on the port. Each
imports Paddle first thing, before uvicorn's thread and signal handlers (`load_engines`), so a
SIGTERM as it starts never meets Paddle's own handler.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import sys
from typing import TYPE_CHECKING, Any

import orjson

from streamrec.errors import ConfigError, StreamrecError
from streamrec.orphans import end_with_parent
from streamrec.paddlesignals import quiet_paddle_import, stop_signals_kept

if TYPE_CHECKING:
    import uvicorn
    from starlette.applications import Starlette

    from streamrec.config import ServingConfig, StreamrecConfig
    from streamrec.serving.scorer import Scorer

logger = logging.getLogger(__name__)

#: The resolved configuration, handed from the command to its workers.
WORKER_CONFIG_ENV = "_STREAMREC_SERVE_WORKER_CONFIG"
# Connections the kernel queues before a server process accepts them: uvicorn's default, which
# it passes again when it starts serving on the socket.
_BACKLOG = 2048


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` and listening, for the server processes to serve on.

    Bound by the command before it says where it serves, so a port in use is one line, not the
    "serving on" line followed by uvicorn's own error. Connections made meanwhile wait in the
    kernel's queue until a server process accepts them.

    Raises:
        ConfigError: it cannot be bound (the port in use, a host not this machine's).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart rebinds at once
        sock.bind((host, port))
        sock.listen(_BACKLOG)
    except OSError as exc:
        sock.close()
        hint = (
            "stop what holds the port, or give another --port (STREAMREC_SERVING__PORT)"
            if exc.errno == errno.EADDRINUSE
            else "check --host and --port (STREAMREC_SERVING__HOST, STREAMREC_SERVING__PORT)"
        )
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}: {hint}") from exc
    sock.set_inheritable(True)  # the server processes serve on it
    return sock


def server_config(app: Starlette | str, serving: ServingConfig, **options: Any) -> uvicorn.Config:
    """The uvicorn configuration of a server of ``app``: its httptools parser, each request's head bounded.

    By ``serving.max_header_bytes`` and ``header_timeout_s`` (`streamrec.serving.heads`); a
    stopping server answers each connection's next request (`streamrec.serving.draining`);
    uvicorn's own log lines at WARNING and up, no access log.
    """
    from streamrec.serving.draining import StoppingProtocol
    from streamrec.serving.heads import ServerConfig

    return ServerConfig(
        app,
        serving.header_timeout_s,
        http=StoppingProtocol,
        h11_max_incomplete_event_size=serving.max_header_bytes,
        log_level="warning",
        access_log=False,
        **options,
    )


def run_one(app: Starlette, sock: socket.socket, serving: ServingConfig) -> None:
    """Serve ``app`` in this process on ``sock`` (from `listen`) until stopped; returns once stopped.

    SIGTERM (an orchestrator's stop) or SIGINT: uvicorn stops accepting, answers the requests
    it holds, closes, and returns, so the command exits 0, as with several processes. uvicorn
    raises the signal again once shut down, to the handler set before it ran: the server's own
    stop here, where the default one would end the process by the signal (143, or a
    KeyboardInterrupt trace). Until uvicorn sets its handlers, the same stop is asked for.
    """
    import signal
    import threading

    from streamrec.serving.draining import DrainingServer

    server = DrainingServer(server_config(app, serving))
    if threading.current_thread() is threading.main_thread():  # as uvicorn: handlers are the main thread's
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, server.handle_exit)
    server.run(sockets=[sock])


def run(cfg: StreamrecConfig, use_store: bool, sock: socket.socket) -> None:
    """Serve with ``cfg.serving.processes`` workers on ``sock`` (from `listen`) until stopped.

    uvicorn's supervisor starts the workers, restarts one that dies, and stops them with it.
    """
    from streamrec.serving.draining import DrainingSupervisor

    doc = {"config": cfg.model_dump(mode="json"), "store": use_store, "supervisor": os.getpid()}
    os.environ[WORKER_CONFIG_ENV] = orjson.dumps(doc).decode()
    config = server_config(
        f"{__name__}:create_app",
        cfg.serving,
        factory=True,
        workers=cfg.serving.processes,
        log_config=worker_log_config(),
    )
    DrainingSupervisor(config, sockets=[sock]).run()


def worker_log_config() -> dict[str, Any]:
    """The logging configuration of uvicorn's, with `engines_loaded` as the factory of a filter.

    uvicorn applies it (``logging.config.dictConfig``) first thing in each server process it
    starts, before it starts a thread there (its health-check answerer) or sets its signal
    handlers: the one point that early where a process runs streamrec's code, and the one where
    Paddle's import can be kept from taking SIGTERM (`load_engines`).
    """
    from uvicorn.config import LOGGING_CONFIG

    return {**LOGGING_CONFIG, "filters": {"streamrec-engines": {"()": f"{__name__}.engines_loaded"}}}


def engines_loaded() -> logging.Filter:
    """In a new server process, `load_engines`; then a filter that passes every record.

    dictConfig asks the factory for a filter. The supervisor applies the same configuration, and
    has its engines loaded already.
    """
    raw = os.environ.get(WORKER_CONFIG_ENV)
    if raw and orjson.loads(raw).get("supervisor") != os.getpid():
        load_engines()
    return logging.Filter()


def create_app() -> Starlette:
    """A worker's app: its own `Scorer` of the configured snapshot directory.

    Raises:
        ConfigError: the worker was started without the command's configuration.
    """
    raw = os.environ.get(WORKER_CONFIG_ENV)
    if not raw:
        raise ConfigError(f"a serving worker needs {WORKER_CONFIG_ENV}: start it with `streamrec serve`")
    doc = orjson.loads(raw)
    if "supervisor" in doc:  # uvicorn's supervisor (absent: an app built in process, as tests do)
        end_with_parent(doc["supervisor"])  # killed outright, it could not stop this process
    load_engines()  # done already where uvicorn applied `worker_log_config`; else it keeps uvicorn's handlers
    from streamrec.config import StreamrecConfig
    from streamrec.logs import configure
    from streamrec.serving.scorer import Scorer

    cfg = StreamrecConfig(**doc["config"])
    configure(cfg.log_level)
    serving = cfg.serving
    try:
        scorer = Scorer(cfg.learner.snapshot_dir, serving.threads, serving.batch_candidates, serving.engine)
    except StreamrecError as exc:  # every export damaged since the command started, say: one line
        logger.error("server process %s cannot load a version: %s", os.getpid(), exc)
        sys.exit(1)  # as uvicorn's own start failures; the supervisor starts another
    return serving_app(cfg, scorer, bool(doc["store"]))


def load_engines() -> None:
    """Import the scorer, and Paddle with it, keeping SIGINT's and SIGTERM's handlers.

    Paddle's own SIGTERM handler would abort the process, where uvicorn's answers the requests
    held and closes (`streamrec.paddlesignals`). Later calls import nothing and change nothing.
    """
    quiet_paddle_import()  # a server process is spawned: the command's filters are not its own
    with stop_signals_kept():
        import streamrec.serving.scorer  # noqa: F401  (Paddle is imported with it)


def serving_app(cfg: StreamrecConfig, scorer: Scorer, use_store: bool) -> Starlette:
    """The app of one server process: its scorer, the history source and, when on, the click join."""
    from streamrec.serving.clicks import start_click_join
    from streamrec.serving.features import history_source
    from streamrec.serving.http import build_app

    clicks, consumer = start_click_join(cfg) if cfg.serving.click_join else (None, None)
    closers = [consumer.stop] if consumer is not None else []
    return build_app(scorer, history_source(cfg, use_store), cfg.serving, clicks=clicks, on_shutdown=closers)
