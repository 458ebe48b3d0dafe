"""Pure batch logic: records in, sequences updated, samples and dead letters out.

A batch's in-memory effects (the negative pools) are staged in its :class:`BatchResult` and
installed by :meth:`SampleBuilder.commit` only once its samples and offsets are committed: a
batch redone after an aborted transaction draws exactly the negatives a clean run draws.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from streamrec.config import ConsumerConfig
from streamrec.consumers.negatives import NoveltyMatchedSampler
from streamrec.deadletters import DeadLetter
from streamrec.errors import InvalidEvent
from streamrec.events import Event, parse_event
from streamrec.featurestore.base import Arrival, FeatureStore, History, Verdict
from streamrec.kafka.records import KafkaMessage
from streamrec.samples import Sample


@dataclass(frozen=True)
class BatchResult:
    """What one batch of records produced, and the sampler state it leaves behind.

    ``events`` counts the valid events, duplicates included; ``duplicates`` the resent ones
    that yielded nothing; conflicting ids are among the dead letters.
    """

    events: int
    sampler: NoveltyMatchedSampler = field(repr=False)
    samples: list[Sample] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    duplicates: int = 0


def _origin(msg: KafkaMessage) -> str:
    """The record an event came in, as the store remembers it: ``partition:offset``."""
    return f"{msg.partition()}:{msg.offset()}"


class SampleBuilder:
    """Turns a batch of event records into sequence updates, samples and dead letters.

    Label rule: an event with ``label`` is an explicit sample with that label (no sampling);
    an unlabelled event whose action is in ``positive_actions`` is a positive plus
    ``negatives`` sampled negatives; other events only extend the sequence.
    """

    def __init__(
        self, cfg: ConsumerConfig, store: FeatureStore, sampler: NoveltyMatchedSampler | None = None
    ) -> None:
        self._cfg = cfg
        self._store = store
        self._positive = frozenset(cfg.positive_actions)
        self.sampler = sampler or NoveltyMatchedSampler(
            cfg.negative_window_ms, cfg.novelty_ms, cfg.negative_pool_size, cfg.seed
        )

    def parse(
        self, records: Sequence[KafkaMessage], now_ms: int
    ) -> tuple[list[tuple[Event, KafkaMessage]], list[DeadLetter]]:
        """Split records into valid events (with their records) and dead letters (with reasons)."""
        events: list[tuple[Event, KafkaMessage]] = []
        dead: list[DeadLetter] = []
        for msg in records:
            try:
                event = parse_event(
                    msg.value(),
                    now_ms=now_ms,
                    max_future_ms=self._cfg.max_future_ms,
                    max_bytes=self._cfg.max_event_bytes,
                )
            except InvalidEvent as exc:
                dead.append(DeadLetter.of(msg, str(exc)))
            else:
                events.append((event, msg))
        return events, dead

    def is_labelled(self, event: Event) -> bool:
        """Whether the event yields training samples."""
        return event.label is not None or event.action in self._positive

    def process(self, records: Sequence[KafkaMessage], now_ms: int | None = None) -> BatchResult:
        """Process one batch: update the store once, then build samples in event-time order.

        An event id yields its samples once per user, within the store's dedup horizon: a
        resent event (the same content from another record) yields nothing and is counted,
        an id reused for other content is dead-lettered, and the same record read again (the
        redo of an aborted batch) yields exactly its samples again. The builder itself is
        unchanged until :meth:`commit`.
        """
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        parsed, dead = self.parse(records, now_ms)
        # A batch spans a few partitions: event-time order (stable, so each user's own order
        # holds) keeps the negative pools' windows true.
        parsed.sort(key=lambda pair: pair[0].ts)
        positive = self._positive
        arrivals = [
            Arrival(e, _origin(msg), e.label is not None or e.action in positive) for e, msg in parsed
        ]
        update = self._store.update(arrivals)
        sampler = self.sampler.copy()
        samples: list[Sample] = []
        duplicates = 0
        first_seen_of = update.first_seen
        for (event, msg), verdict, seen_at, history in zip(
            parsed, update.verdicts, update.first_seen_at, update.histories, strict=True
        ):
            if verdict is not Verdict.ACCEPTED:
                if verdict is Verdict.DUPLICATE:
                    duplicates += 1
                else:
                    reason = f"event id {event.event_id!r} reused with other content (first at {seen_at})"
                    dead.append(DeadLetter.of(msg, reason))
                continue
            first_seen = first_seen_of[event.item_id]
            sampler.observe(event.ts, event.item_id, event.category_id, first_seen)
            if history is not None:
                self._samples(samples, sampler, event, history, first_seen)
        return BatchResult(len(parsed), sampler, samples, dead, duplicates)

    def commit(self, result: BatchResult) -> None:
        """Keep the batch's in-memory effects: call once its samples and offsets are durable."""
        self.sampler = result.sampler

    def _samples(
        self,
        out: list[Sample],
        sampler: NoveltyMatchedSampler,
        event: Event,
        history: History,
        first_seen: int,
    ) -> None:
        """Add an event's samples to ``out``: its own, and for an implicit positive the
        sampled negatives, all with the same history."""
        items, categories = history.items, history.categories
        event_id, user_id, ts = event.event_id, event.user_id, event.ts
        if event.label is not None:
            out.append(Sample(event_id, user_id, ts, event.item_id, event.category_id, event.label,
                              items, categories))
            return
        out.append(Sample(event_id, user_id, ts, event.item_id, event.category_id, 1, items, categories))
        negatives = sampler.draw(
            self._cfg.negatives,
            new=sampler.is_new(first_seen, ts),
            ts=ts,
            exclude={event.item_id, *items},
            key=event_id,
        )
        for k, (item, category) in enumerate(negatives):
            out.append(Sample(f"{event_id}~n{k}", user_id, ts, item, category, 0, items, categories))
