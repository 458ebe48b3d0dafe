"""A batch's part in each partition's stored state.

Its offsets and watermark, and in the ``join`` labelling mode its impressions and clicks (see
`streamrec.featurestore.partitions`).

An impression (``impression_action``, no ``label``) on time opens a window with the history it
read; an on-time click (a positive action, no ``label``) may take one; a late click can only be
counted as a late label. Inputs go in offset order, so where a batch ends changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import msgspec

from streamrec.consumers.lateness import Watermarks
from streamrec.events import Event
from streamrec.featurestore.base import History
from streamrec.featurestore.partitions import Decision, Features, JoinInput, PartitionBatch, SeqFeatures
from streamrec.kafka.records import KafkaMessage, Partition
from streamrec.samples import Sample


class Judged(msgspec.Struct, gc=False):
    """A valid event of the batch, from partition ``key``, as it is judged.

    ``behind`` is how far behind its partition's newest event time it was when late (else None);
    ``accepted`` whether the store took it (a dead-lettered late event never reaches it), and
    ``history`` what the store read for it. A msgspec struct, made in C (a dataclass's
    ``__init__`` is a Python call, one an event); untracked by the garbage collector, as nothing
    it holds can refer back to it.
    """

    event: Event
    msg: KafkaMessage
    key: Partition
    behind: int | None
    accepted: bool = False
    history: History | None = None


#: An impression's sample features and its history's, as of its time (from its event, its
#: history and the user's profile): what its window keeps for its decision.
Describe = Callable[[Event, History], tuple[Features, SeqFeatures]]


class JoinRule:
    """Which events the join takes, by the consumer configuration (None: the ``sampled`` mode)."""

    def __init__(
        self,
        impression_action: str | None,
        positive_actions: frozenset[str],
        describe: Describe | None = None,
    ) -> None:
        """Impressions are ``impression_action`` events; clicks ``positive_actions`` ones.

        ``describe`` gives an impression's declared features, which its window keeps (None:
        the default schema, nothing to keep).
        """
        self.impression_action = impression_action
        self.positive_actions = positive_actions
        self.describe = describe

    @property
    def enabled(self) -> bool:
        """Whether the ``join`` mode is on."""
        return self.impression_action is not None

    def is_impression(self, event: Event) -> bool:
        """Whether the event is an unlabelled impression, which the join labels."""
        return event.action == self.impression_action and event.label is None

    def batches(
        self,
        spans: Mapping[Partition, tuple[int, int]],
        judged: Sequence[Judged],
        watermarks: Watermarks,
        epochs: Mapping[Partition, int],
    ) -> list[PartitionBatch]:
        """One `PartitionBatch` per partition of the batch.

        One `PartitionBatch` per partition of the batch (``spans``: see
        `offset_spans`), ``judged`` in delivery (offset) order.
        """
        keys = list(spans)
        inputs: dict[Partition, list[JoinInput]] = {key: [] for key in keys}
        if self.enabled:
            for item in judged:
                joined = self._input(item, watermarks.allowed_ms or 0)
                if joined is not None:
                    inputs[item.key].append(joined)
        join, featured = self.enabled, self.describe is not None
        return [
            PartitionBatch(key, epochs[key], first, last, watermarks.newest(key),
                           watermarks.allowed_ms if join else None, tuple(inputs[key]), featured)
            for key, (first, last) in zip(keys, spans.values(), strict=True)
        ]

    def _input(self, item: Judged, allowed_ms: int) -> JoinInput | None:
        event, offset = item.event, item.msg.offset() or 0
        if event.label is not None:
            return None
        if event.action == self.impression_action:
            history = item.history
            if item.behind is None and item.accepted and history is not None:
                if self.describe is None:
                    return JoinInput("impression", offset, event, history.items, history.categories)
                features, seq_features = self.describe(event, history)
                return JoinInput("impression", offset, event, history.items, history.categories,
                                 features=features, seq_features=seq_features)
            return None
        if event.action not in self.positive_actions:
            return None
        if item.behind is not None:  # judged by the watermark it fell behind
            return JoinInput("late_click", offset, event, watermark=event.ts + item.behind - allowed_ms)
        return JoinInput("click", offset, event) if item.accepted else None


def decided_samples(decisions: Sequence[Decision]) -> list[Sample]:
    """The samples of impressions whose labels were decided.

    The impression's id, time, item and history, its declared features and its history's as
    of its time (see `JoinRule`), and the label.
    """
    return [
        Sample(d.event_id, d.user_id, d.ts, d.item_id, d.category_id, d.label, d.items, d.categories)
        if d.features is None  # the default schema's: the call it always was
        else Sample(d.event_id, d.user_id, d.ts, d.item_id, d.category_id, d.label, d.items, d.categories,
                    d.features, d.seq_features or {})
        for d in decisions
    ]
