"""``streamrec serve`` on several processes sharing one port: one engine per core.

An engine (ONNX Runtime or Paddle Inference) scores one request at a time on one core (threads of one process
add nothing: measured in docs/operating/sizing.md), so a server uses a machine's cores with one
process each. uvicorn's supervisor binds the port once and starts ``processes`` workers on it
(the kernel hands each connection to one of them) and restarts one that dies. Each worker loads
the promoted version itself and follows the serving pointer on its own (`Scorer`), so a
promotion reaches every worker within ``poll_s`` with no request dropped; each has its own
admission limits (`streamrec.serving.admission`).

Workers are started fresh (multiprocessing's spawn: no predictor crosses a fork). They get the
configuration the command resolved (flags, env, file) through one environment variable, as
JSON, and build the same app as a single-process server. Each ends with the supervisor
(`streamrec.orphans`): killed outright, it would otherwise leave them serving on the port.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import orjson

from streamrec.errors import ConfigError
from streamrec.orphans import end_with_parent

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from streamrec.config import StreamrecConfig
    from streamrec.serving.scorer import Scorer

#: The resolved configuration, handed from the command to its workers.
WORKER_CONFIG_ENV = "_STREAMREC_SERVE_WORKER_CONFIG"


def run(cfg: StreamrecConfig, use_store: bool) -> None:
    """Serve with ``cfg.serving.processes`` workers until stopped (uvicorn's supervisor)."""
    import uvicorn

    doc = {"config": cfg.model_dump(mode="json"), "store": use_store, "supervisor": os.getpid()}
    os.environ[WORKER_CONFIG_ENV] = orjson.dumps(doc).decode()
    uvicorn.run(
        f"{__name__}:create_app",
        factory=True,
        workers=cfg.serving.processes,
        host=cfg.serving.host,
        port=cfg.serving.port,
        log_level="warning",
        access_log=False,
    )


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
    with uvicorns_stop_signals():
        from streamrec.config import StreamrecConfig
        from streamrec.logs import configure
        from streamrec.serving.scorer import Scorer

        cfg = StreamrecConfig(**doc["config"])
        configure(cfg.log_level)
        serving = cfg.serving
        scorer = Scorer(cfg.learner.snapshot_dir, serving.threads, serving.batch_candidates, serving.engine)
        return serving_app(cfg, scorer, bool(doc["store"]))


@contextmanager
def uvicorns_stop_signals() -> Iterator[None]:
    """Keep SIGINT and SIGTERM with the handlers they had (uvicorn's) through the block.

    uvicorn's worker builds the app (this factory) after it has set its handlers, and Paddle,
    first imported here, sets its own on SIGTERM: it prints a C++ "FatalError" and ends the
    process at once, so a stopped server dropped the requests it held instead of answering
    them and closing, as uvicorn's shutdown does.
    """
    stops = (signal.SIGINT, signal.SIGTERM)
    before = {sig: signal.getsignal(sig) for sig in stops}
    try:
        yield
    finally:
        for sig, handler in before.items():
            if handler is not None:  # None: not set from Python, nothing to put back
                signal.signal(sig, handler)


def serving_app(cfg: StreamrecConfig, scorer: Scorer, use_store: bool) -> Starlette:
    """The app of one server process: its scorer, the history source and, when on, the click join."""
    from streamrec.serving.clicks import start_click_join
    from streamrec.serving.features import history_source
    from streamrec.serving.http import build_app

    clicks, consumer = start_click_join(cfg) if cfg.serving.click_join else (None, None)
    closers = [consumer.stop] if consumer is not None else []
    return build_app(scorer, history_source(cfg, use_store), cfg.serving, clicks=clicks, on_shutdown=closers)
