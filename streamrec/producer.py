"""Publishing events: `EventProducer` for applications, `publish` for datasets."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable
from types import TracebackType

from confluent_kafka import KafkaError, KafkaException, Message

from streamrec.config import KafkaConfig
from streamrec.errors import DeliveryError
from streamrec.events import Event
from streamrec.features.schema import FeatureSchema
from streamrec.kafka.clients import make_producer, produce
from streamrec.wording import plural

logger = logging.getLogger(__name__)


class EventProducer:
    """Sends contract events to the events topic, keyed by user, with delivery reports checked.

    Use as a context manager; leaving it flushes and raises `DeliveryError` if any
    event was not acknowledged::

        with EventProducer(cfg) as producer:
            producer.send(Event("e-1", "42", "1001", "7", "click", now_ms))
    """

    def __init__(self, cfg: KafkaConfig, schema: FeatureSchema | None = None) -> None:
        """Send to ``cfg``'s events topic; declared features at their ``schema`` fields."""
        self._cfg = cfg
        self._schema = schema
        self._producer = make_producer(cfg)  # idempotent: a retried send is not written twice
        self.delivered = 0
        self._pending: dict[int, str] = {}  # send number -> what was sent, until acknowledged
        self._failed: dict[str, str] = {}  # what was sent -> why it was not delivered
        self._sends = 0

    def _on_delivery(self, label: str, number: int, err: KafkaError | None, msg: Message) -> None:
        self._pending.pop(number, None)
        if err is None:
            self.delivered += 1
        else:
            self._failed[label] = err.str()

    @property
    def unacknowledged(self) -> list[str]:
        """The events sent but neither delivered nor failed yet (their ids), oldest first."""
        return list(self._pending.values())

    def send(self, event: Event) -> None:
        """Queue one event; blocks briefly when the local queue is full.

        The record timestamp is the event time, which consumers align partitions on.
        """
        self._send(event.event_id, event.user_id.encode(), event.to_json(self._schema), event.ts)

    def send_raw(self, key: bytes | None, value: bytes, timestamp_ms: int = 0) -> None:
        """Queue raw bytes on the events topic (for bridges that already hold the wire form).

        ``timestamp_ms`` 0 means "now" (the record's create time).
        """
        self._send(f"record #{self._sends} (key {key!r})", key, value, timestamp_ms)

    def _send(self, label: str, key: bytes | None, value: bytes, timestamp_ms: int) -> None:
        number, self._sends = self._sends, self._sends + 1
        self._pending[number] = label
        try:
            produce(
                self._producer, self._cfg.events_topic, value, key=key, timestamp_ms=timestamp_ms,
                on_delivery=functools.partial(self._on_delivery, label, number),
            )
        except KafkaException as exc:
            self._pending.pop(number, None)
            raise DeliveryError(f"cannot produce {label} to {self._cfg.events_topic}: {exc}") from exc
        self._producer.poll(0)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait for every queued event; raise if any was not acknowledged, naming them.

        Resending the named events is safe: consumers yield an event id's samples once.
        """
        left = self._producer.flush(timeout_s)
        # what did reach the broker, said first: a caller (a publish of a file) knows what is left
        delivered = f"{self.delivered} of {plural(self._sends, 'event')} delivered"
        if left:
            raise DeliveryError(
                f"{delivered}; {left} still unacknowledged after {timeout_s:g} s (is the broker at "
                f"{self._cfg.bootstrap_servers} up?); {_AGAIN}: {_some(self.unacknowledged)}"
            )
        if self._failed:
            failed, self._failed = self._failed, {}
            reasons = "; ".join(sorted(set(failed.values())))
            raise DeliveryError(
                f"{delivered}; {len(failed)} not delivered ({reasons}); {_AGAIN}: {_some(list(failed))}"
            )

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
    speedup: float = 0.0,
    on_progress: Callable[[int], None] | None = None,
    schema: FeatureSchema | None = None,
) -> int:
    """Publish ``events`` in order; return the count.

    ``rate`` paces them at that many events/s; ``speedup`` at that multiple of their own event
    time (60: an hour of events in a minute); neither (0) sends as fast as possible. Declared
    features go to their fields in ``schema`` (`Event.to_json`).
    """
    sent = 0
    start = time.monotonic()
    first_ts: int | None = None
    seen: dict[str, int] = {}  # event id -> the event's hash: a file's repeats, said at the end
    resent: list[str] = []
    reused: list[str] = []
    producer = EventProducer(cfg, schema)
    try:
        with producer:
            for event in events:
                earlier = seen.get(event.event_id)
                if earlier is None:
                    seen[event.event_id] = hash(event)
                else:  # the id was there: with this content, or another event's
                    (resent if earlier == hash(event) else reused).append(event.event_id)
                first_ts = event.ts if first_ts is None else first_ts
                by_time = (event.ts - first_ts) / 1000 / speedup if speedup > 0 else 0.0
                due = sent / rate if rate > 0 else by_time
                ahead = due - (time.monotonic() - start)
                if ahead > 0:
                    time.sleep(ahead)
                producer.send(event)
                sent += 1
                if on_progress is not None and sent % 1000 == 0:
                    on_progress(1000)
            if on_progress is not None:
                on_progress(sent % 1000)
    except KeyboardInterrupt as exc:  # the producer flushed what it could as it left
        exc.add_note(
            f"{producer.delivered} of the {plural(sent, 'event')} sent were delivered to {cfg.events_topic} "
            "before it stopped; publishing them again is safe (the consumers keep each event id once)"
        )
        raise
    logger.info("published events=%d topic=%s seconds=%.3f", sent, cfg.events_topic, time.monotonic() - start)
    if resent or reused:
        logger.warning(
            "published %d events repeating an earlier event id to %s: %d resent (the same event: the "
            "consumers keep it once; %s), %d reused for another event (the consumers dead-letter it; %s)",
            len(resent) + len(reused), cfg.events_topic, len(resent), _some(resent) or "none",
            len(reused), _some(reused) or "none",
        )
    return sent


_AGAIN = "sending them again is safe (the consumers keep each event id once)"


def _some(labels: list[str], shown: int = 10) -> str:
    """The first ``shown`` labels, and how many more there are."""
    more = f" and {len(labels) - shown} more" if len(labels) > shown else ""
    return ", ".join(labels[:shown]) + more
