"""The ``/metrics`` endpoint: one registry served over HTTP, never a reason to stop a job."""

from __future__ import annotations

import logging
import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

from streamrec.closing import Closing
from streamrec.local.ports import address

logger = logging.getLogger(__name__)

#: Every interface: Prometheus scrapes from another host or container.
DEFAULT_HOST = "0.0.0.0"


class MetricsServer(Closing):
    """A running ``/metrics`` endpoint on its own daemon thread.

    `close` stops it and frees the port; one never closed dies with the process, since
    its thread is a daemon.
    """

    def __init__(self, httpd: WSGIServer, thread: threading.Thread) -> None:
        """Wrap what ``prometheus_client.start_http_server`` returned."""
        self._httpd = httpd
        self._thread = thread
        self._closed = False

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self._httpd.server_address[1])

    def close(self) -> None:
        """Stop serving and release the port; safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        self._httpd.shutdown()  # returns once serve_forever has left its loop
        self._httpd.server_close()
        self._thread.join()


def serve(
    registry: CollectorRegistry, port: int, host: str = DEFAULT_HOST, *, setting: str = "the metrics port"
) -> MetricsServer | None:
    """Serve ``registry`` on ``http://host:port/metrics``; ``None`` when metrics are off.

    Port 0 turns metrics off. A port that cannot be bound (taken, or not permitted) logs one
    warning naming ``setting`` and returns ``None``: the job runs on without metrics, since
    losing a dashboard is better than losing training or the consumers.
    """
    if port == 0:
        logger.info("metrics off (port 0)")
        return None
    try:
        httpd, thread = start_http_server(port, host, registry)
    except OSError as exc:
        logger.warning(
            "metrics off: cannot serve on %s port=%d error=%r; running without them "
            "(free the port or choose another with %s)",
            host, port, exc.strerror or str(exc), setting,
        )
        return None
    logger.info("serving metrics url=http://%s/metrics", address(host, port))
    return MetricsServer(httpd, thread)
