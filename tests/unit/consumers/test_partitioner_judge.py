"""The rule that tells a misconfigured partitioner (stop, naming the setting) from a few misplaced
records (dead-lettered, the topic read on): pure, record by record.
"""

from __future__ import annotations

import logging

import pytest

import streamrec.consumers.placement
from streamrec.config import Partitioner
from streamrec.consumers.partitioner_judge import STOP_AFTER, PartitionerJudge
from streamrec.errors import ConfigError, PartitionerMismatch
from streamrec.kafka.partitioning import partitions_of
from streamrec.kafka.records import Partition
from tests.unit.consumers.test_placement import click, home, judged, placement, record

P0, P1 = Partition("ev", 0), Partition("ev", 1)


def test_a_partition_whose_first_records_are_all_the_other_partitioners_stops_naming_the_setting() -> None:
    judge = PartitionerJudge("murmur2", stop_after=3)
    judge.record(P0, right=False, other_right=True)
    judge.record(P0, right=True, other_right=True)  # both put it there: no evidence
    judge.record(P0, right=False, other_right=True)
    assert judge.verdict is None
    judge.record(P0, right=False, other_right=True)
    assert judge.verdict is not None and judge.verdict.startswith("ev[0]: its first 3 misplaced records")
    assert "STREAMREC_KAFKA__PARTITIONER=crc32" in judge.verdict
    assert "consistent_random" in judge.verdict  # what librdkafka calls it


@pytest.mark.parametrize("settling", [(True, False), (False, False)], ids=["configured only", "neither"])
def test_a_record_only_the_configured_partitioner_or_neither_explains_settles_its_partition(
    settling: tuple[bool, bool],
) -> None:
    judge = PartitionerJudge("crc32", stop_after=3)
    judge.record(P0, right=False, other_right=True)
    judge.record(P0, *settling)  # a correct producer's record, or bad data: a producer bug, not the setting
    for _ in range(10):
        judge.record(P0, right=False, other_right=True)
    assert judge.verdict is None and judge.explained[P0] == 11
    for _ in range(3):  # another partition's own first records still count
        judge.record(P1, right=False, other_right=True)
    assert judge.verdict is not None and "STREAMREC_KAFKA__PARTITIONER=murmur2" in judge.verdict


def test_a_partition_read_in_place_in_a_batch_is_settled() -> None:
    judge = PartitionerJudge("murmur2", stop_after=2)
    judge.in_place([P0])
    for _ in range(5):
        judge.record(P0, right=False, other_right=True)
    assert judge.verdict is None


def test_the_placement_check_stops_on_a_topic_written_by_crc32_and_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    check = placement("murmur2")
    users = [f"u{k}" for k in range(2 * STOP_AFTER * 4)]
    records = [record(click(u, k), k, partition=home(u, "crc32")) for k, u in enumerate(users)]
    with caplog.at_level(logging.WARNING, logger="streamrec.consumers.placement"):
        reasons = judged(check, *records)
    assert len(reasons) > STOP_AFTER
    hint = "(crc32 puts it there: STREAMREC_KAFKA__PARTITIONER=crc32 if every producer uses it)"
    assert all(r.endswith(hint) for r in reasons.values())
    hints = [r for r in caplog.records if "set STREAMREC_KAFKA__PARTITIONER=crc32" in r.getMessage()]
    assert len(hints) == 1  # once, not a line a record
    with pytest.raises(PartitionerMismatch, match="STREAMREC_KAFKA__PARTITIONER=crc32") as raised:
        check.check()
    assert isinstance(raised.value, ConfigError)  # the CLI's one line and exit 1


def test_a_few_misplaced_records_among_correct_ones_are_dead_lettered_and_the_check_goes_on() -> None:
    check = placement("murmur2")
    users = [u for u in (f"u{k}" for k in range(4000)) if home(u, "murmur2") != home(u, "crc32")]
    strays = [record(click(u, k), k, partition=home(u, "crc32")) for k, u in enumerate(users[:3])]
    good = [record(click(u, 10 + k), 10 + k) for k, u in enumerate(users[3:400])]
    for _ in range(STOP_AFTER):  # a producer bug that keeps misplacing, batch after batch
        assert len(judged(check, *strays, *good)) == 3
    check.check()  # no stop: the partitions read records only murmur2 puts there


def test_a_clean_batch_settles_its_partitions_without_hashing_again(monkeypatch: pytest.MonkeyPatch) -> None:
    check = placement("murmur2")
    calls: list[str] = []

    def counted(keys: list[bytes], count: int, partitioner: Partitioner) -> list[int]:
        calls.append(partitioner)
        return partitions_of(keys, count, partitioner)

    monkeypatch.setattr(streamrec.consumers.placement, "partitions_of", counted)
    assert judged(check, *(record(click(f"u{k}", k), k) for k in range(50))) == {}
    assert calls == ["murmur2"]  # the hot path: one hash, as before
    assert check.judge.settled == {Partition("ev", p) for p in {home(f"u{k}") for k in range(50)}}
