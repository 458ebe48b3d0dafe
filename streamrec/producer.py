"""Publishing events: :class:`EventProducer` for applications, :func:`publish` for datasets."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from types import TracebackType

from confluent_kafka import KafkaError, KafkaException, Message

from streamrec.config import KafkaConfig
from streamrec.errors import DeliveryError
from streamrec.events import Event
from streamrec.kafka.clients import make_producer, produce

logger = logging.getLogger(__name__)


class EventProducer:
    """Sends contract events to the events topic, keyed by user, with delivery reports checked.

    Use as a context manager; leaving it flushes and raises :class:`DeliveryError` if any
    event was not acknowledged::

        with EventProducer(cfg) as producer:
            producer.send(Event("e-1", "42", "1001", "7", "click", now_ms))
    """

    def __init__(self, cfg: KafkaConfig) -> None:
        self._cfg = cfg
        self._producer = make_producer(cfg)
        self.delivered = 0
        self.failed = 0
        self._reasons: set[str] = set()  # distinct failure reasons, a few kept for the error

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            self.delivered += 1
            return
        self.failed += 1
        if len(self._reasons) < 10:
            self._reasons.add(f"{msg.topic()}: {err.str()}")

    def send(self, event: Event) -> None:
        """Queue one event; blocks briefly when the local queue is full.

        The record timestamp is the event time, which consumers align partitions on.
        """
        self.send_raw(event.user_id.encode(), event.to_json(), event.ts)

    def send_raw(self, key: bytes | None, value: bytes, timestamp_ms: int = 0) -> None:
        """Queue raw bytes on the events topic (for bridges that already hold the wire form).

        ``timestamp_ms`` 0 means "now" (the record's create time).
        """
        try:
            produce(
                self._producer, self._cfg.events_topic, value,
                key=key, timestamp_ms=timestamp_ms, on_delivery=self._on_delivery,
            )
        except KafkaException as exc:
            raise DeliveryError(f"cannot produce to {self._cfg.events_topic}: {exc}") from exc
        self._producer.poll(0)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait for every queued event; raise if any was not acknowledged."""
        left = self._producer.flush(timeout_s)
        if left:
            raise DeliveryError(
                f"{left} event(s) still unacknowledged after {timeout_s}s: is the broker at "
                f"{self._cfg.bootstrap_servers} up?"
            )
        if self.failed:
            count, reasons = self.failed, "; ".join(sorted(self._reasons))
            self.failed, self._reasons = 0, set()
            raise DeliveryError(f"{count} event(s) not delivered: {reasons}")

    def __enter__(self) -> EventProducer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.flush()
        else:
            self._producer.flush(5.0)


def publish(
    events: Iterable[Event],
    cfg: KafkaConfig,
    *,
    rate: float = 0.0,
    on_progress: Callable[[int], None] | None = None,
) -> int:
    """Publish ``events`` in order at ``rate`` events/s (0 = as fast as possible); return count."""
    sent = 0
    start = time.monotonic()
    with EventProducer(cfg) as producer:
        for event in events:
            if rate > 0:
                ahead = sent / rate - (time.monotonic() - start)
                if ahead > 0:
                    time.sleep(ahead)
            producer.send(event)
            sent += 1
            if on_progress is not None and sent % 1000 == 0:
                on_progress(1000)
        if on_progress is not None:
            on_progress(sent % 1000)
    logger.info("published events=%d topic=%s seconds=%.3f", sent, cfg.events_topic, time.monotonic() - start)
    return sent
