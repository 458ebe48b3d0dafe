"""The learner's intake: records decoded or dead-lettered with the reason, and dead letters
acknowledged before the writer returns.
"""

from __future__ import annotations

from typing import Any

import pytest

from streamrec.config import KafkaConfig
from streamrec.deadletters import DeadLetter
from streamrec.errors import DeliveryError
from streamrec.features import FeatureSchema, FeatureSpec
from streamrec.kafka.records import Header, Position, Record
from streamrec.learner.intake import DeadLetterWriter, decode
from streamrec.samples import Sample

SAMPLE = Sample("s1", "u1", 1_511_658_000_000, "i1", "c1", 1, ("i0",), ("c0",))


def test_decode_keeps_valid_samples_in_order_and_dead_letters_the_rest_whole() -> None:
    headers: list[Header] = [("trace", b"t-1")]
    records = [
        Record(SAMPLE.to_json(), 0, topic="s", key=b"u1"),
        Record(b"\xff", 1, topic="s", key=b"u2", timestamp=7, headers=headers),
        Record(SAMPLE.to_json(), 2, topic="s"),
    ]
    intake = decode(records)
    assert intake.samples == [SAMPLE, SAMPLE]
    assert intake.kept == [0, 2]  # the records each sample came from
    [letter] = intake.dead
    assert (letter.value, letter.key, letter.timestamp_ms) == (b"\xff", b"u2", 7)
    assert letter.headers == tuple(headers)
    assert letter.position == Position("s", 0, 1) and letter.reason.startswith("not valid JSON")


def test_an_intake_then_another_is_the_decoding_of_their_records_together() -> None:
    records = [
        Record(SAMPLE.to_json(), 0, topic="s"),
        Record(b"{}", 1, topic="s"),
        Record(SAMPLE.to_json(), 2, topic="s"),
        Record(b"\xff", 3, topic="s"),
        Record(SAMPLE.to_json(), 4, topic="s"),
    ]
    whole = decode(records)
    for cut in range(len(records) + 1):
        joined = decode(records[:cut]).then(decode(records[cut:]), cut)
        assert joined == whole, cut
    assert whole.kept == [0, 2, 4] and [d.position.offset for d in whole.dead] == [1, 3]


class StalledProducer:
    """Takes records but never has them acknowledged."""

    def __init__(self) -> None:
        self.produced = 0

    def produce(self, topic: str, **_: Any) -> None:
        self.produced += 1

    def flush(self, timeout: float) -> int:
        return self.produced


def test_the_writer_connects_only_at_the_first_dead_letter_and_raises_when_not_acknowledged() -> None:
    made: list[StalledProducer] = []

    def make(_: KafkaConfig) -> StalledProducer:
        made.append(StalledProducer())
        return made[-1]

    writer = DeadLetterWriter(KafkaConfig(samples_dlq_topic="dlq"), 1024, make=make)  # type: ignore[arg-type]  # a fake producer
    writer.write([])
    assert made == []
    letter = DeadLetter("bad", Position("s", 0, 5), b"x")
    with pytest.raises(DeliveryError, match="dead letters to dlq: 0 refused, 2 not acknowledged"):
        writer.write([letter, letter])


def test_a_sample_holding_a_declared_feature_of_another_kind_is_dead_lettered_naming_it() -> None:
    # Found by a tour of docs/your-features.md: consumers that declared genres ids, then an id,
    # wrote samples of both kinds; the learner died on them with a traceback (ValueError: feature
    # 'genres' holds values of kinds ['id', 'ids'] in one batch), and again on every restart.
    schema = FeatureSchema.of([FeatureSpec(name="genres", kind="ids"),
                               FeatureSpec(name="year", kind="number")])
    ok = Sample("s1", "u1", 1_511_658_000_000, "i1", "c1", 1, ("i0",), ("c0",),
                features={"genres": ("a", "b")}, seq_features={"genres": (("c",),), "year": (1999.0,)})
    along = Sample("s2", "u1", 1_511_658_000_000, "i1", "c1", 0, ("i0",), ("c0",),
                   features={"genres": ("a",)}, seq_features={"genres": ("drama",)})
    target = Sample("s3", "u1", 1_511_658_000_000, "i1", "c1", 0, ("i0",), ("c0",), features={"year": "old"})
    records = [Record(x.to_json(), k, topic="s") for k, x in enumerate([ok, along, target, SAMPLE])]
    intake = decode(records, schema)
    assert intake.samples == [ok, SAMPLE] and intake.kept == [0, 3]
    assert [d.position.offset for d in intake.dead] == [1, 2]
    assert intake.dead[0].reason == (
        "feature 'genres' is declared ids and the sample holds id values: the consumers declare it "
        "otherwise (STREAMREC_FEATURES)"
    )
    assert intake.dead[1].reason.startswith("feature 'year' is declared number and the sample holds id")
    assert decode(records).samples == [ok, along, target, SAMPLE]  # without a schema, as before


def test_a_sample_holding_a_number_beyond_float32_is_dead_lettered_naming_it() -> None:
    # Found by a tour of docs/your-features.md: a sample with price 1e300 (finite in JSON, inf in
    # the learner's float32 columns) made its micro-batch's step non-finite: the step was skipped
    # with the 39 good samples beside it (loss nan, a bad micro-batch toward max_bad_batches).
    schema = FeatureSchema.of([FeatureSpec(name="price", kind="number", transform="standardize")])
    big = Sample("s1", "u1", 1_511_658_000_000, "i1", "c1", 1, ("i0",), ("c0",), features={"price": 1e300})
    along = Sample("s2", "u1", 1_511_658_000_000, "i1", "c1", 0, ("i0",), ("c0",),
                   features={"price": 2.0}, seq_features={"price": (-4e38,)})
    fine = Sample("s3", "u1", 1_511_658_000_000, "i1", "c1", 0, ("i0",), ("c0",),
                  features={"price": 3.4e38}, seq_features={"price": (None,)})
    records = [Record(x.to_json(), k, topic="s") for k, x in enumerate([big, along, fine, SAMPLE])]
    intake = decode(records, schema)
    assert intake.samples == [fine, SAMPLE] and intake.kept == [2, 3]
    assert [d.reason for d in intake.dead] == [
        "feature 'price' holds 1e+300, beyond float32's range (±3.403e+38): the consumers of this "
        "release refuse it: scale it, or give it a transform",
        "feature 'price' holds -4e+38, beyond float32's range (±3.403e+38): the consumers of this "
        "release refuse it: scale it, or give it a transform",
    ]
