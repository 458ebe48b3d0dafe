"""What the learner's and the consumers' metrics share.

A registry of their own, a ``/metrics`` server, the lag probe, and closing both.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from streamrec.closing import Closing
from streamrec.observability.lag import LagCollector, LagProbe
from streamrec.observability.server import DEFAULT_HOST, MetricsServer, serve


class ProcessMetrics(Closing):
    """A process's metrics in a registry of their own (tests and the demo run several).

    Closing it stops its server and its lag client.
    """

    def __init__(self, prefix: str, port_setting: str) -> None:
        """Metric names start with ``prefix``.

        ``port_setting`` names the port's flag and env variable in the warning about a taken
        port.
        """
        self.registry = CollectorRegistry()
        self._prefix = prefix
        self._port_setting = port_setting
        self._server: MetricsServer | None = None
        self._lag: LagProbe | None = None

    def track_lag(self, probe: LagProbe) -> None:
        """Report ``probe``'s lag as ``<prefix>_lag_records``; closed with these metrics."""
        self._lag = probe
        self.registry.register(LagCollector(probe, self._prefix))

    def serve(self, port: int, host: str = DEFAULT_HOST) -> MetricsServer | None:
        """Serve ``/metrics``; ``None`` when off (port 0) or the port could not be bound."""
        self._server = serve(self.registry, port, host, setting=self._port_setting)
        return self._server

    def close(self) -> None:
        """Stop the server and close the lag client, where there are any."""
        if self._server is not None:
            self._server.close()
        if self._lag is not None:
            self._lag.close()
