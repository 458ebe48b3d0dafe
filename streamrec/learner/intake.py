"""The learner's side of the sample contract: decode a micro-batch, dead-letter what breaks it.

A malformed sample used to end the learner on every restart (or, with ``label: null``, turn
every weight to NaN). Now each record is validated as it is decoded; an invalid one becomes a
`DeadLetter` on ``samples_dlq_topic`` (the record itself, with
the reason in headers) and the rest are trained on.

Dead letters are durable before the positions that pass them are: `DeadLetterWriter.write`
returns only once the broker has acknowledged every one, and the loop advances its positions
(which a snapshot then stores) only after that. A crash in between re-reads the records and
dead-letters them again: the samples DLQ is at-least-once, and its ``streamrec.topic``,
``streamrec.partition`` and ``streamrec.offset`` headers tell duplicates apart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import chain

import numpy as np
from confluent_kafka import KafkaError, Message, Producer

from streamrec.config import KafkaConfig
from streamrec.deadletters import DeadLetter
from streamrec.errors import DeliveryError, InvalidSample
from streamrec.features.schema import KIND_TYPES, MAX_NUMBER, FeatureSchema, FeatureSpec, Value, kind_of
from streamrec.kafka.clients import make_producer, produce
from streamrec.kafka.records import KafkaMessage
from streamrec.samples import Sample, parse_sample

# How long to wait for the broker to acknowledge a micro-batch's dead letters: a handful of
# small records take milliseconds; 30 s rides out a leader election, and the loop keeps the
# consumer alive meanwhile (the write runs on the training thread).
_ACK_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Intake:
    """A micro-batch's records, decoded: the valid samples in record order, and the rest.

    ``kept[i]`` is the index among the records of the record ``samples[i]`` was decoded from.
    """

    samples: list[Sample]
    dead: list[DeadLetter]
    kept: list[int] = field(default_factory=list)

    def then(self, later: Intake, records: int) -> Intake:
        """This intake, then ``later``'s: decoded from the records after this one's ``records``."""
        kept = self.kept + [records + i for i in later.kept]
        return Intake(self.samples + later.samples, self.dead + later.dead, kept)


def decode(records: Sequence[KafkaMessage], schema: FeatureSchema | None = None) -> Intake:
    """Validate and decode each record; an invalid one becomes a dead letter with the reason.

    With ``schema`` (the learner's), a sample holding a declared feature's values of another
    kind (consumers that declare it otherwise) is one too: it would stop the whole batch.
    """
    samples: list[Sample] = []
    dead: list[tuple[int, DeadLetter]] = []  # with its record's index
    kept: list[int] = []
    for i, msg in enumerate(records):
        try:
            samples.append(parse_sample(msg.value()))
            kept.append(i)
        except InvalidSample as exc:
            dead.append((i, DeadLetter.of(msg, str(exc))))
    if schema is not None and samples and not _of_kinds(samples, schema.extras):
        reasons = [_wrong_kind(sample, schema.extras) for sample in samples]
        wrong = [(i, DeadLetter.of(records[i], r)) for i, r in zip(kept, reasons, strict=True) if r]
        dead = sorted(dead + wrong, key=lambda x: x[0])
        samples = [x for x, r in zip(samples, reasons, strict=True) if not r]
        kept = [i for i, r in zip(kept, reasons, strict=True) if not r]
    return Intake(samples, [letter for _, letter in dead], kept)


_NONE = frozenset({type(None)})


def _of_kinds(samples: Sequence[Sample], specs: Sequence[FeatureSpec]) -> bool:
    """Whether every declared feature's values in ``samples`` are of its kind (types gathered in C)."""
    for spec in specs:
        allowed = KIND_TYPES[spec.kind] | _NONE
        if not set(map(type, [s.features.get(spec.name) for s in samples])) <= allowed:
            return False
        along = list(chain.from_iterable([s.seq_features.get(spec.name, ()) for s in samples]))
        if not set(map(type, along)) <= allowed:
            return False
        if spec.kind == "number":
            if not (_in_range([s.features.get(spec.name) for s in samples]) and _in_range(along)):
                return False
    return True


def _in_range(numbers: Sequence[Value | None]) -> bool:
    """Whether every number (None: absent) is within float32's range, as the learner's columns hold them."""
    try:
        values = np.array(numbers, dtype=np.float64)  # None reads NaN, which passes
    except OverflowError:  # an int past a double's range
        return False
    return not bool((np.abs(values) > MAX_NUMBER).any())


def _wrong_kind(sample: Sample, specs: Sequence[FeatureSpec]) -> str:
    """The reason ``sample`` holds a declared feature of another kind; "" when it does not."""
    for spec in specs:
        values = [sample.features.get(spec.name), *sample.seq_features.get(spec.name, ())]
        for value in values:
            if value is not None and type(value) not in KIND_TYPES[spec.kind]:
                return (
                    f"feature {spec.name!r} is declared {spec.kind} and the sample holds "
                    f"{kind_of(value)} values: "
                    "the consumers declare it otherwise (STREAMREC_FEATURES)"
                )
            if spec.kind == "number" and value is not None and not _in_range([value]):
                return (
                    f"feature {spec.name!r} holds {value:.4g}, beyond float32's range (±{MAX_NUMBER:.4g}): "
                    "the consumers of this release refuse it: scale it, or give it a transform"
                )
    return ""


class DeadLetterWriter:
    """Produces dead letters to one topic and waits until the broker has acknowledged them.

    The producer (idempotent, ``acks=all``) is made at the first dead letter, so a learner
    that never meets one never connects it.
    """

    def __init__(
        self,
        cfg: KafkaConfig,
        max_bytes: int,
        make: Callable[[KafkaConfig], Producer] = make_producer,
    ) -> None:
        """Write to ``cfg.samples_dlq_topic``, cutting values to ``max_bytes``.

        Args:
            cfg: The broker and the topic.
            max_bytes: A longer value is cut, with its length and sha256 in headers.
            make: Builds the producer (tests inject a fake).
        """
        self._cfg = cfg
        self._max_bytes = max_bytes
        self._make = make
        self._producer: Producer | None = None

    @property
    def topic(self) -> str:
        """Where the dead letters go."""
        return self._cfg.samples_dlq_topic

    def write(self, letters: Sequence[DeadLetter]) -> None:
        """Produce ``letters`` and return once every one is acknowledged.

        Raises:
            DeliveryError: A dead letter was refused or not acknowledged in time; the records
                it stands for must not be passed.
        """
        if not letters:
            return
        if self._producer is None:
            self._producer = self._make(self._cfg)
        failed: list[KafkaError] = []

        def on_delivery(err: KafkaError | None, _: Message) -> None:
            if err is not None:
                failed.append(err)

        for letter in letters:
            produce(
                self._producer, self.topic, letter.record_value(self._max_bytes),
                key=letter.key, timestamp_ms=letter.timestamp_ms,
                headers=letter.record_headers(self._max_bytes), on_delivery=on_delivery,
            )
        unacknowledged = self._producer.flush(_ACK_TIMEOUT_S)
        if failed or unacknowledged:
            first = f": {failed[0].str()}" if failed else ""
            raise DeliveryError(
                f"dead letters to {self.topic}: {len(failed)} refused, {unacknowledged} not "
                f"acknowledged within {_ACK_TIMEOUT_S:.0f}s{first}"
            )
