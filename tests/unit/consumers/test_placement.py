"""Records that break the events topic's partitioning become dead letters with a reason that
says what to change; the rest of the batch goes on.
"""

from __future__ import annotations

import functools

import pytest

from streamrec.config import ConsumerConfig, Partitioner
from streamrec.consumers.placement import Placement
from streamrec.consumers.processor import SampleBuilder
from streamrec.events import Event, parse_event
from streamrec.featurestore.memory import MemoryFeatureStore
from streamrec.kafka.partitioning import CRC32, MURMUR2, partitions_of
from streamrec.kafka.records import Partition, Record
from streamrec.observability.consumer import reason_kind

T0 = 1_511_658_000_000
COUNT = 4


def home(user: str, partitioner: Partitioner = MURMUR2) -> int:
    return partitions_of([user.encode()], COUNT, partitioner)[0]


def record(event: Event, offset: int, *, key: bytes | None = b"", partition: int | None = None) -> Record:
    """``event``'s record, keyed by its user and in its user's partition unless told."""
    return Record(event.to_json(), offset, topic="ev", key=event.user_id.encode() if key == b"" else key,
                  partition=home(event.user_id) if partition is None else partition, timestamp=event.ts)


def placement(partitioner: Partitioner = MURMUR2, count: int = COUNT) -> Placement:
    check = Placement(partitioner)
    check.counts = {"ev": count}
    return check


def click(user: str, n: int = 0) -> Event:
    return Event(f"e{n}", user, "i1", "c1", "click", T0 + n)


def judged(check: Placement, *records: Record) -> dict[int, str]:
    parse = functools.partial(parse_event, now_ms=T0, max_future_ms=60_000, max_bytes=16_384)
    return check.misplaced([(parse(r.value()), r, Partition("ev", r.partition())) for r in records])


def test_records_keyed_by_their_user_in_its_partition_pass() -> None:
    users = [f"u{k}" for k in range(40)]
    assert judged(placement(), *(record(click(u), k) for k, u in enumerate(users))) == {}


def test_a_record_without_a_key_is_told_to_publish_with_the_user_as_key() -> None:
    reasons = judged(placement(), record(click("u1"), 0), record(click("u2"), 1, key=None))
    assert list(reasons) == [1]
    assert reasons[1].startswith("record has no key: the events topic is keyed by user_id")
    assert reason_kind(reasons[1]) == "no_key"


def test_a_record_keyed_by_something_else_quotes_the_key_and_the_user() -> None:
    reasons = judged(placement(), record(click("u1"), 0, key=b"session-9\xff" * 20))
    assert reasons[0].startswith("record key b'session-9\\xffsession-9")
    assert "is not the event's user_id 'u1'" in reasons[0] and len(reasons[0]) < 300
    assert reason_kind(reasons[0]) == "wrong_key"


@pytest.mark.parametrize("partitioner", [MURMUR2, CRC32])
def test_a_record_in_another_partition_than_its_key_hashes_to_names_the_right_one(
    partitioner: Partitioner,
) -> None:
    user = next(u for u in (f"u{k}" for k in range(100)) if home(u, MURMUR2) != home(u, CRC32))
    other: Partitioner = CRC32 if partitioner == MURMUR2 else MURMUR2
    reasons = judged(placement(partitioner), record(click(user), 0, partition=home(user, other)))
    assert reasons[0].startswith(
        f"user '{user}' belongs in ev[{home(user, partitioner)}] by the {partitioner} partitioner over "
        f"{COUNT} partitions, not ev[{home(user, other)}]"
    )
    assert "STREAMREC_KAFKA__PARTITIONER" in reasons[0] and reason_kind(reasons[0]) == "wrong_partition"
    assert judged(placement(other), record(click(user), 0, partition=home(user, other))) == {}


def test_one_partition_checks_only_the_key() -> None:
    in_one = [record(click("u1"), 0, partition=0), record(click("u2"), 1, key=b"x", partition=0)]
    wrong_key = judged(placement(), record(click("u2"), 0, key=b"x"))[0]
    assert judged(placement(count=1), *in_one) == {1: wrong_key}


def test_a_topic_without_a_partition_count_is_a_bug_not_a_pass() -> None:
    with pytest.raises(ValueError, match="no partition count for ev"):
        judged(Placement(MURMUR2), record(click("u1"), 0))


def test_the_builder_dead_letters_misplaced_records_whole_and_samples_the_rest() -> None:
    builder = SampleBuilder(ConsumerConfig(negatives=0), MemoryFeatureStore(length=3), placement=placement())
    good, unkeyed = record(click("u1", 1), 0), record(click("u2", 2), 1, key=None)
    result = builder.process([good, unkeyed], now_ms=T0 + 10)
    assert [s.sample_id for s in result.samples] == ["e1"]
    assert [(d.reason.split(":")[0], d.value, d.key) for d in result.dead] == [
        ("record has no key", unkeyed.value(), None)
    ]
    assert result.events == 1  # a misplaced record is no event of the batch
