"""Pure batch logic: records in, sequences updated, samples and dead letters out.

A batch's in-memory effects (the negative pools) are staged in its `BatchResult` and
installed by `SampleBuilder.commit` only once its samples and offsets are committed: a
batch redone after an aborted transaction draws exactly the negatives a clean run draws. The
partitions' watermarks (`streamrec.consumers.lateness`) move the same way, so a redo
judges the same events late.

The builder also reports records whose timestamp is not their event time (a producer such
as kcat that leaves it at the send time): the consumers' event-time alignment reads record
timestamps, so such a topic is aligned by send time, silently, unless someone says so.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME

from streamrec.config import ConsumerConfig
from streamrec.consumers.joins import JoinRule, Judged, decided_samples
from streamrec.consumers.lateness import Watermarks
from streamrec.consumers.negatives import MixedSampler, NoveltyMatchedSampler, sampler_for
from streamrec.consumers.placement import Placement
from streamrec.consumers.sample_maker import SampleMaker, picked
from streamrec.consumers.user_features import UserFeatures
from streamrec.deadletters import DeadLetter
from streamrec.errors import FeatureStoreLost, InvalidEvent
from streamrec.events import Event, parse_event
from streamrec.features.schema import FeatureSchema
from streamrec.featurestore.base import (
    ACCEPTED,
    CONFLICT,
    DUPLICATE,
    Answer,
    Arrival,
    FeatureStore,
    behaviour_features,
)
from streamrec.featurestore.partitions import PartitionOutcome, PartitionStore
from streamrec.featurestore.profiles import ProfileStore
from streamrec.kafka.records import KafkaMessage, Partition, offset_spans, partition_of
from streamrec.samples import Sample, encode_sample

logger = logging.getLogger(__name__)

#: How far a record's timestamp may be from its event's ``ts`` before it is reported: the
#: alignment's default skew, the error in a record timestamp that alignment tolerates.
TIMESTAMP_TOLERANCE_MS = 60_000


@dataclass(frozen=True)
class BatchResult:
    """What one batch of records produced, and the sampler state it leaves behind.

    ``events`` counts the valid events, duplicates and late ones included; ``duplicates``
    the resent ones that yielded nothing; ``late`` those behind their partition's watermark
    (dead-lettered, or kept in their sequences without samples); conflicting ids are among
    the dead letters. ``timestamp_mismatches`` counts records whose timestamp is more than
    the tolerance away from their event time. ``late_labels`` counts the late clicks that
    fell in an impression's window after it closed (the ``join`` mode). ``values`` holds each
    sample's wire form (`Sample.to_json`), in the same order: one for each sample, or
    the result is refused when made (``ValueError``), not when its samples are sent.
    ``claims`` holds the epochs its partitions were claimed at, to check before its commit
    (`check_claims`). ``negatives_short`` counts the negatives the sampler could not draw
    (too few fitting items in its pools), ``negatives_fallback`` those meant from the user's
    history or categories that came from the global pools (nothing fitting there).
    """

    events: int
    sampler: NoveltyMatchedSampler = field(repr=False)
    samples: list[Sample] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    duplicates: int = 0
    late: int = 0
    timestamp_mismatches: int = 0
    watermarks: Watermarks | None = field(default=None, repr=False)
    late_labels: int = 0
    values: list[bytes] = field(default_factory=list, repr=False)
    claims: dict[Partition, int] = field(default_factory=dict, repr=False)
    negatives_short: int = 0
    negatives_fallback: int = 0

    def __post_init__(self) -> None:
        if len(self.values) != len(self.samples):  # the runners send them pairwise
            raise ValueError(f"{len(self.samples)} samples but {len(self.values)} wire forms")


class Parsed(NamedTuple):
    """A batch's records parsed.

    Valid events with their records and partitions, dead letters with reasons, and the offsets
    the records span in each partition.
    """

    events: list[tuple[Event, KafkaMessage, Partition]]
    dead: list[DeadLetter]
    spans: dict[Partition, tuple[int, int]]


def late_reason(ts: int, behind_ms: int, key: Partition, allowed_ms: int) -> str:
    """The dead-letter reason of a late event."""
    return (
        f"late event: ts={ts} is {behind_ms} ms behind the newest event time seen on {key} "
        f"(allowed lateness {allowed_ms} ms)"
    )


class SampleBuilder:
    """Turns a batch of event records into sequence updates, samples and dead letters.

    Label rule: an event with ``label`` is an explicit sample with that label (no sampling);
    an unlabelled event whose action is in ``positive_actions`` is a positive plus
    ``negatives`` sampled negatives; other events only extend the sequence. An event late
    for its partition's watermark yields no sample whatever its label (see
    `streamrec.consumers.lateness`).

    Examples:
        Three views by one user, on the in-memory store: each is a positive whose sequence
        holds what the user did strictly before it (no negatives yet: the pool is empty).

        >>> from streamrec.config import ConsumerConfig
        >>> from streamrec.events import Event
        >>> from streamrec.featurestore import MemoryFeatureStore
        >>> from streamrec.kafka import Record
        >>> builder = SampleBuilder(ConsumerConfig(), MemoryFeatureStore(length=50))
        >>> views = [Event(f"e{k}", "u1", f"i{k}", "c1", "pv", 1_700_000_000_000 + k) for k in range(3)]
        >>> result = builder.process([Record(view.to_json(), k) for k, view in enumerate(views)])
        >>> builder.commit(result)
        >>> [(s.item_id, s.label, s.seq_items) for s in result.samples]
        [('i0', 1, ()), ('i1', 1, ('i0',)), ('i2', 1, ('i0', 'i1'))]
    """

    def __init__(
        self,
        cfg: ConsumerConfig,
        store: FeatureStore,
        sampler: NoveltyMatchedSampler | None = None,
        *,
        timestamp_tolerance_ms: int = TIMESTAMP_TOLERANCE_MS,
        placement: Placement | None = None,
        schema: FeatureSchema | None = None,
        profiles: ProfileStore | None = None,
        partitions: PartitionStore | None = None,
    ) -> None:
        """Build samples by ``cfg`` on ``store``.

        Report records whose timestamp is more than ``timestamp_tolerance_ms`` away from their
        event time; dead-letter records that ``placement`` finds misplaced (the runners'
        records; in-memory ones have no partitioner to check). Read the declared features of
        ``schema`` (`streamrec.features`; by default the store's, which keeps its behaviour
        ones) into each sample (`streamrec.consumers.sample_maker`). Join its user features
        (role ``user``) as of each sample's time from ``profiles``, a profile store the
        caller gives (required when the schema declares any). Keep the partitions' state
        (watermarks, join windows) in ``partitions``, by default in ``store``.
        """
        self._cfg = cfg
        self._store = store
        self._partitions = store if partitions is None else partitions
        self._positive = frozenset(cfg.positive_actions)
        self.sampler = sampler or sampler_for(cfg)
        self.watermarks = Watermarks(cfg.allowed_lateness_ms)
        self._epochs: dict[Partition, int] = {}  # partitions claimed, and their epochs
        # The group's committed offsets of some partitions (negative: none), asked when a durable
        # store holds no state of a partition about to be claimed (`_claim`); the runners set it.
        # None: the builder's process is the only one to read these partitions (a rebuild).
        self.committed: Callable[[Sequence[Partition]], Mapping[Partition, int]] | None = None
        # How this events topic's record origins end (`FeatureStore.events_topic`).
        self.origin_ending = ""
        self._join = JoinRule(cfg.impression_action if cfg.labels == "join" else None, self._positive)
        self._tolerance_ms = timestamp_tolerance_ms
        self._mismatch_warned: set[Partition] = set()  # one warning per partition
        self.placement = placement
        schema = schema or store.schema
        if behaviour_features(schema) != store.behaviour_features:
            raise ValueError("the feature store keeps other behaviour features than the schema declares")
        users = schema.role("user")
        self._extras = schema.extras
        # user features (streamrec.consumers.user_features): written per batch, read as of each sample
        self.profiles = UserFeatures(profiles, users)
        # the target's own: behaviour features but outcomes (a target's outcome is its label)
        self._item_features = tuple(f.name for f in self._extras if f.role == "behaviour" and not f.outcome)
        context_features = tuple(f.name for f in schema.extras if f.role == "context")
        featured = bool(self._item_features or context_features or users)  # chosen once, not per event
        self._maker = SampleMaker(
            cfg.negatives,
            self.profiles,
            self._item_features,
            context_features,
            featured=featured,
            mixed=isinstance(self.sampler, MixedSampler),  # negatives from the user's world too
        )
        if featured:
            self._join.describe = self._maker.described  # a join window keeps its impression's

    def parse(self, records: Sequence[KafkaMessage], now_ms: int) -> Parsed:
        """Split records into valid events (with their records) and dead letters (with reasons).

        Misplaced records are dead letters too. Pure but for their evidence (`Placement.judge`): runs ahead.
        """
        events: list[tuple[Event, KafkaMessage, Partition]] = []
        dead: list[DeadLetter] = []
        keys = [partition_of(msg) for msg in records]
        future_ms, max_bytes = self._cfg.max_future_ms, self._cfg.max_event_bytes
        # the default schema's call as it always was: no argument more an event
        parse = functools.partial(parse_event, extras=self._extras) if self._extras else parse_event
        for msg, key in zip(records, keys, strict=True):
            try:
                event = parse(msg.value(), now_ms=now_ms, max_future_ms=future_ms, max_bytes=max_bytes)
            except InvalidEvent as exc:
                dead.append(DeadLetter.of(msg, str(exc)))
            else:
                events.append((event, msg, key))
        if self.placement is not None and events:
            misplaced = self.placement.misplaced(events)
            if misplaced:
                dead += [DeadLetter.of(events[i][1], reason) for i, reason in misplaced.items()]
                events = [item for i, item in enumerate(events) if i not in misplaced]
        return Parsed(events, dead, offset_spans(records, keys))

    def stores(self, event: Event) -> bool:
        """Whether the event enters its user's sequence.

        A join-mode impression, labelled or not, is an exposure, not behaviour.
        """
        return event.action != self._join.impression_action

    def process(
        self,
        records: Sequence[KafkaMessage],
        now_ms: int | None = None,
        *,
        parsed: Parsed | None = None,
        meanwhile: Callable[[], None] | None = None,
    ) -> BatchResult:
        """Process one batch.

        Update the store once, building samples in event-time order as its answers come.

        An event id yields its samples once per user, within the store's dedup horizon: a
        resent event (the same content from another record) yields nothing and is counted,
        an id reused for other content is dead-lettered, and the same record read again (the
        redo of an aborted batch) yields exactly its samples again. An event behind its
        partition's watermark yields no sample: it is dead-lettered or only stored, by
        ``late_events``. In the ``join`` mode an impression yields its one sample when its
        label is decided, in this batch or a later one. The builder itself is unchanged until
        `commit`, but for the partitions it claims.

        ``parsed`` is what `parse` made of the records already; ``meanwhile`` runs while
        the store works (see `FeatureStore.update`): the runner parses the next batch.
        """
        if parsed is None:
            now_ms = int(time.time() * 1000) if now_ms is None else now_ms
            parsed = self.parse(records, now_ms)
        if self.placement is not None:  # before any effect: misplaced records may mean a wrong setting
            self.placement.check()
        events, spans = parsed.events, parsed.spans
        dead = list(parsed.dead)  # a redo starts from the same dead letters
        self._claim(spans)
        watermarks = self.watermarks.copy()
        judged, mismatches = self._judge(events, watermarks)
        kept = self._keep(judged, dead)
        sampler = self.sampler.copy()
        outcomes: list[PartitionOutcome] | None = None
        taken: set[tuple[Partition, int]] = set()
        with self._store.update(self._arrivals(judged, kept), meanwhile) as update:
            answers: Iterable[Answer] = update.answers()
            if self._join.enabled or self.profiles.enabled:
                answers = listed = list(answers)
                if self.profiles.enabled:  # after the verdicts: a conflict's user features never land
                    pairs = zip(kept, listed, strict=True)
                    landing = [judged[i].event for i, answer in pairs if answer[0] is not CONFLICT]
                    self._maker.as_of = self.profiles.update(landing)
                if self._join.enabled:  # an impression's window needs its verdict before partitions advance
                    for i, (verdict, history, _) in zip(kept, listed, strict=True):
                        judged[i].accepted, judged[i].history = verdict is ACCEPTED, history
                    outcomes, taken = self._advance(spans, judged, watermarks)
            # otherwise the answers come as the store gives them: samples are built meanwhile
            samples, values, duplicates, late_kept = self._build(
                [judged[i] for i in kept], answers, update.first_seen, taken, sampler, dead
            )
        if outcomes is None:  # no join: nothing in the loop waited for the partitions
            outcomes, _ = self._advance(spans, judged, watermarks)
        for outcome in outcomes:
            decided = decided_samples(outcome.decisions)
            samples += decided
            values += map(encode_sample, decided)
        late_dropped = len(judged) - len(kept)
        return BatchResult(
            len(events),
            sampler,
            samples,
            dead,
            duplicates,
            late=late_kept + late_dropped,
            timestamp_mismatches=mismatches,
            watermarks=watermarks,
            late_labels=sum(o.late_labels for o in outcomes),
            values=values,
            claims={key: self._epochs[key] for key in spans},
            negatives_short=sampler.short - self.sampler.short,
            negatives_fallback=sampler.fallback - self.sampler.fallback,
        )

    def _keep(self, judged: list[Judged], dead: list[DeadLetter]) -> list[int]:
        """The events that go to the store, as indexes into ``judged``, in event-time order.

        A batch spans a few partitions, and the negative pools' windows need time order (a
        stable sort: each user's own order holds). Late events are dead-lettered into ``dead``
        instead when ``late_events`` says so.
        """
        drop = self._cfg.late_events == "dead_letter"
        allowed = self.watermarks.allowed_ms or 0
        kept = []
        for i, item in enumerate(judged):
            if item.behind is None or not drop:
                kept.append(i)
            else:
                reason = late_reason(item.event.ts, item.behind, item.key, allowed)
                dead.append(DeadLetter.of(item.msg, reason))
        times = [item.event.ts for item in judged]
        kept.sort(key=times.__getitem__)
        return kept

    def _build(
        self,
        kept: list[Judged],
        answers: Iterable[Answer],
        first_seen_of: Mapping[str, int],
        taken: set[tuple[Partition, int]],
        sampler: NoveltyMatchedSampler,
        dead: list[DeadLetter],
    ) -> tuple[list[Sample], list[bytes], int, int]:
        """The samples of the ``kept`` events, by the store's answers.

        The samples of the ``kept`` events by the store's ``answers``, in their order, with
        the negatives ``sampler`` draws; conflicting ids are dead-lettered into ``dead``.
        Returns the samples, their wire forms, the duplicates and the late events kept without
        samples.

        Each sample is encoded as it is made: the answers come while Redis still runs the calls
        of later users, and the encoding fills that wait instead of adding to the sending
        (``bench/consumer_throughput.py``, alternately: 0.360-0.369 of a bare consume against
        0.338-0.359 encoding them all when sent).
        """
        samples: list[Sample] = []
        values: list[bytes] = []
        duplicates, late_kept = 0, 0
        join = self._join.enabled
        item_features = self._item_features
        make = self._maker.samples  # once a batch, not once an event
        for item, (verdict, history, seen_at) in zip(kept, answers, strict=True):
            event, msg = item.event, item.msg
            if verdict is not ACCEPTED:
                if verdict is DUPLICATE:
                    duplicates += 1
                else:
                    reason = f"event id {event.event_id!r} reused with other content (first at {seen_at})"
                    dead.append(DeadLetter.of(msg, reason))
                continue
            if item.behind is not None:  # in its sequence now, but neither in the pools nor sampled
                late_kept += 1
                continue
            if join and not self.stores(event):  # an exposure: not in the pools; the join labels it
                if event.label is not None and history is not None:  # unless it has a label
                    make(samples, values, sampler, event, history, first_seen=0)
                continue
            first_seen = first_seen_of[event.item_id]
            if item_features:
                own = picked(event.features, item_features)
                sampler.observe(event.ts, event.item_id, event.category_id, first_seen, own)
            else:
                sampler.observe(event.ts, event.item_id, event.category_id, first_seen)
            if history is not None and not (taken and (item.key, msg.offset()) in taken):
                make(samples, values, sampler, event, history, first_seen)
        return samples, values, duplicates, late_kept

    def _advance(
        self, spans: Mapping[Partition, tuple[int, int]], judged: list[Judged], watermarks: Watermarks
    ) -> tuple[list[PartitionOutcome], set[tuple[Partition, int]]]:
        """Advance the batch's partitions (watermarks, the join's windows).

        Their outcomes, and the clicks the join took (partition, offset), which make no sample
        of their own.
        """
        batches = self._join.batches(spans, judged, watermarks, self._epochs)
        window = self._cfg.label_window_ms  # closed windows are kept as long, for late labels
        outcomes = self._partitions.advance(batches, window, window)
        taken = {(b.partition, offset) for b, o in zip(batches, outcomes, strict=True) for offset in o.taken}
        return outcomes, taken

    def _arrivals(self, judged: list[Judged], kept: list[int]) -> list[Arrival]:
        """What the store is asked about each kept event.

        Its history when it may yield a sample; an impression of the join mode is judged by its
        id but stays out of the sequence (see `stores`), and wants its history for its
        window or its label.
        """
        positive, impression = self._positive, self._join.impression_action
        out = []
        for i in kept:
            item = judged[i]
            event = item.event
            stored = event.action != impression
            wanted = event.label is not None or event.action in positive or not stored
            origin = self.origin(item.key.partition, item.msg.offset())
            out.append(Arrival(event, origin, item.behind is None and wanted, stored))
        return out

    def origin(self, partition: int, offset: int | None) -> str:
        """What the store remembers of the record an event came in (`Arrival.origin`)."""
        return f"{partition}:{offset}{self.origin_ending}"

    def _claim(self, spans: Mapping[Partition, tuple[int, int]]) -> None:
        """Claim the partitions new to this builder.

        Their epochs, and their watermarks as of the offset they are read from (a restart or a
        rebalance resumes them exactly). A durable store that holds no state of one is asked
        to write nothing for it: the group's committed offset there (`committed`) says whether
        it is new (started afresh) or its state was lost.

        Raises:
            FeatureStoreLost: the group committed past 0 on a partition the store holds nothing of.
        """
        starts = {key: first for key, (first, _) in spans.items() if key not in self._epochs}
        if not starts:
            return
        partitions = self._partitions
        ask = self.committed if partitions.durable else None
        claims = partitions.claim(starts, create=ask is None)
        unfound = {key: starts[key] for key, claim in claims.items() if not claim.found}
        if ask is not None and unfound:
            lost = {key: offset for key, offset in ask(list(unfound)).items() if offset > 0}
            if lost:
                raise FeatureStoreLost(partitions.lost_reason(lost))
            claims.update(partitions.claim(unfound))  # new to the group: started afresh
        for key, claim in claims.items():
            self._epochs[key] = claim.epoch
            self.watermarks.restore(key, claim.newest)

    def release(self) -> None:
        """Forget the partitions claimed (after a rebalance).

        Each is claimed again, and its watermark read again, when it next comes.
        """
        self._epochs.clear()
        self.watermarks = Watermarks(self._cfg.allowed_lateness_ms)

    def _judge(
        self, parsed: list[tuple[Event, KafkaMessage, Partition]], watermarks: Watermarks
    ) -> tuple[list[Judged], int]:
        """Judge each event against its partition's watermark.

        Judge each event against its partition's watermark, in the order its partition
        delivered it, and count the record timestamps that are off.
        """
        judged: list[Judged] = []
        mismatches = 0
        tolerance = self._tolerance_ms
        for event, msg, key in parsed:
            stamp = msg.timestamp()[1]
            if stamp > 0 and abs(stamp - event.ts) > tolerance:  # 0: an in-memory record, unstamped
                mismatches += 1
                self._warn_mismatch(key, msg, stamp, event.ts)
            judged.append(Judged(event, msg, key, watermarks.judge(key, event.ts)))
        return judged, mismatches

    def _warn_mismatch(self, key: Partition, msg: KafkaMessage, stamp: int, ts: int) -> None:
        if key in self._mismatch_warned:
            return
        self._mismatch_warned.add(key)
        # a topic with message.timestamp.type=LogAppendTime has the broker overwrite every
        # record's timestamp: no producer can set it, the topic's setting must change
        fix = (
            "the topic stamps records with the broker's append time (message.timestamp.type="
            "LogAppendTime): set the events topic's message.timestamp.type to CreateTime"
            if msg.timestamp()[0] == TIMESTAMP_LOG_APPEND_TIME
            else "the producer must set each record's timestamp to its event's ts"
        )
        logger.warning(
            "record timestamp is not the event time partition=%s offset=%s record_ts=%d ts=%d "
            "difference_ms=%d: alignment orders records by their timestamps; %s (once per partition)",
            key,
            msg.offset(),
            stamp,
            ts,
            stamp - ts,
            fix,
        )

    def commit(self, result: BatchResult) -> None:
        """Keep the batch's in-memory effects: call once its samples and offsets are durable."""
        self.sampler = result.sampler
        if result.watermarks is not None:
            self.watermarks = result.watermarks
