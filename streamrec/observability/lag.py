"""Consumer lag: how many records of a topic a process has not handled yet.

Lag is measured when Prometheus scrapes, by a client of the metrics' own that never joins the
group (no ``subscribe``), so the poll loop's consumer is never touched from another thread and
a slow broker delays a scrape, not a batch. A partition's position is, in order: the one the
process reports (the learner's trained-up-to positions), else the group's committed offset,
else the start of the partition (``auto.offset.reset=earliest``: everything retained is
unread).

On a topic written in transactions (the samples topic), each commit leaves a marker record
that no reader ever handles, so an idle reader shows a lag of about one per partition.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaException, TopicPartition
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from streamrec.config import KafkaConfig
from streamrec.kafka.clients import consumer_config
from streamrec.kafka.records import Partition

logger = logging.getLogger(__name__)

# All broker queries of one measurement share this budget, so that a scrape answers within
# Prometheus's default 10 s scrape_timeout even while the broker is down.
QUERY_BUDGET_S = 3.0
# librdkafka's syslog levels: 2 is critical, below the errors (3) of every refused reconnect.
LAG_CLIENT_LOG_LEVEL = 2


class LagClient(Protocol):
    """The part of a confluent-kafka ``Consumer`` that lag needs (tests pass fakes)."""

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        """Cluster metadata; ``.topics[topic].partitions`` maps partition ids."""

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        """The partition's (low, high) watermarks."""

    def committed(self, partitions: list[TopicPartition], timeout: float = -1) -> list[TopicPartition]:
        """The group's committed offsets (negative where it has none)."""

    def close(self) -> None:
        """Release the client."""


def lag_client(cfg: KafkaConfig, group_id: str) -> Consumer:
    """A consumer of ``group_id`` that only queries offsets.

    It never subscribes, so it never joins the group nor changes its assignments. It is never
    polled either, so its librdkafka log lines would queue unserved, one a reconnect (~20 a
    second while the broker is down), and come out at its close: it logs only critical ones.
    The process's own clients log the broker's state, and a failed query reads
    ``<prefix>_lag_query_success`` 0.
    """
    return Consumer({**consumer_config(cfg, group_id), "log_level": LAG_CLIENT_LOG_LEVEL})


def partition_lag(position: int | None, low: int, high: int) -> int:
    """Records from ``position`` (``None``: the start) to the high watermark.

    Records below ``low`` are gone from the topic: they can never be handled, so they are
    not lag.
    """
    start = low if position is None else max(position, low)
    return max(high - start, 0)


class LagProbe:
    """Measures one topic's lag per partition for one reader, with a client it owns.

    Thread-safe: concurrent scrapes take turns, so the broker sees one query at a time.
    """

    def __init__(
        self,
        client: LagClient,
        topic: str,
        positions: Callable[[], Mapping[Partition, int]] | None = None,
        *,
        budget_s: float = QUERY_BUDGET_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Measure ``topic``.

        ``positions`` returns the reader's own next offsets, where it keeps them (the others
        come from the group's committed offsets).
        """
        self.topic = topic
        self._client = client
        self._positions = positions
        self._budget_s = budget_s
        self._clock = clock
        self._lock = threading.Lock()

    def measure(self) -> dict[int, int]:
        """Records not yet handled, per partition of the topic.

        Raises:
            KafkaException: a broker query failed.
            TimeoutError: the queries took longer than the budget.
        """
        with self._lock:
            deadline = self._clock() + self._budget_s
            partitions = self._partitions(deadline)
            known = self._known()
            committed = self._committed([p for p in partitions if p not in known], deadline)
            lags = {}
            for p in partitions:
                low, high = self._client.get_watermark_offsets(
                    TopicPartition(self.topic, p), timeout=self._left(deadline)
                )
                lags[p] = partition_lag(known.get(p, committed.get(p)), low, high)
            return lags

    def close(self) -> None:
        """Close the client."""
        self._client.close()

    def _known(self) -> dict[int, int]:
        positions = self._positions() if self._positions is not None else {}
        return {key.partition: offset for key, offset in positions.items() if key.topic == self.topic}

    def _partitions(self, deadline: float) -> list[int]:
        meta = self._client.list_topics(self.topic, timeout=self._left(deadline)).topics.get(self.topic)
        return sorted(meta.partitions) if meta is not None else []

    def _committed(self, partitions: list[int], deadline: float) -> dict[int, int]:
        if not partitions:
            return {}
        asked = [TopicPartition(self.topic, p) for p in partitions]
        answered = self._client.committed(asked, timeout=self._left(deadline))
        return {tp.partition: tp.offset for tp in answered if tp.offset >= 0}

    def _left(self, deadline: float) -> float:
        left = deadline - self._clock()
        if left <= 0:
            raise TimeoutError(f"lag query took over {self._budget_s:g} s")
        return left


class LagCollector(Collector):
    """The consumer lag of each partition, measured at each scrape.

    ``<prefix>_lag_records`` per partition, measured at each scrape, and
    ``<prefix>_lag_query_success`` (0 when the broker did not answer; the lag is then absent).
    """

    def __init__(self, probe: LagProbe, prefix: str) -> None:
        """Collect ``probe``'s lag under metric names starting with ``prefix``."""
        self._probe = probe
        self._prefix = prefix

    def describe(self) -> Iterator[Metric]:
        """The metric names, without querying the broker (the registry asks at registration)."""
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        """Measure the lag now."""
        lag, success = self._families()
        try:
            lags = self._probe.measure()
        except (KafkaException, TimeoutError) as exc:
            logger.debug("lag query failed topic=%s error=%s", self._probe.topic, exc)
            success.add_metric([], 0.0)
        else:
            for partition, records in lags.items():
                lag.add_metric([self._probe.topic, str(partition)], float(records))
            success.add_metric([], 1.0)
        yield lag
        yield success

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        lag = GaugeMetricFamily(
            f"{self._prefix}_lag_records",
            "Records of the input topic not handled yet, per partition (measured at scrape)",
            labels=["topic", "partition"],
        )
        success = GaugeMetricFamily(
            f"{self._prefix}_lag_query_success",
            "1 when the broker answered this scrape's lag query, 0 when it did not",
        )
        return lag, success
