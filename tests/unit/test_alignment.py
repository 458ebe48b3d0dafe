"""EventTimeAligner: event-time release order, holding back for empty partitions."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, TopicPartition

from streamrec import alignment
from streamrec.alignment import EventTimeAligner


@dataclass
class Recorder:
    """Records pause/resume calls the way confluent_kafka.Consumer takes them."""

    paused: set[int] = field(default_factory=set)

    def pause(self, parts: list[TopicPartition]) -> None:
        self.paused.update(tp.partition for tp in parts)

    def resume(self, parts: list[TopicPartition]) -> None:
        self.paused.difference_update(tp.partition for tp in parts)


@dataclass
class Msg:
    part: int
    ts: int = 0
    eof: bool = False
    off: int = 0

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return self.part

    def offset(self) -> int:
        return self.off

    def timestamp(self) -> tuple[int, int]:
        return (1, self.ts)

    def error(self) -> KafkaError | None:
        return KafkaError(KafkaError._PARTITION_EOF) if self.eof else None


def aligner(parts: int = 3, skew: int = 100, idle_ms: int = 60_000) -> tuple[EventTimeAligner, Recorder]:
    rec = Recorder()
    a = EventTimeAligner(rec, skew, idle_ms)  # type: ignore[arg-type]  # the recorder suffices
    a.assign([TopicPartition("t", p) for p in range(parts)])
    return a, rec


def ts_of(msgs: list) -> list[int]:
    return [m.timestamp()[1] for m in msgs]


def test_records_come_out_in_event_time_order_up_to_the_skew() -> None:
    a, _ = aligner()
    out = a.push([Msg(0, 1000), Msg(0, 5000), Msg(1, 1050), Msg(2, 990), Msg(2, 1200)])
    # Watermark: the slowest partition's head is 1050 (partition 1): release <= 1150.
    assert ts_of(out) == [990, 1000, 1050]
    assert a.buffered() == 2
    out = a.push([Msg(1, 6000)])
    assert ts_of(out) == [1200]  # partition 2 (head 1200) is live and now the slowest
    assert ts_of(a.push([Msg(2, 7000)])) == [5000]  # the watermark is now 5000


def test_only_a_prefix_per_partition_is_released() -> None:
    a, _ = aligner(parts=2)
    out = a.push([Msg(0, 500, off=0), Msg(0, 100, off=1), Msg(1, 150)])
    # Partition 0's record at offset 1 (ts 100) waits behind offset 0 (ts 500 > 150 + 100).
    assert ts_of(out) == [150]


def test_an_empty_partition_holds_the_others_back_until_idle() -> None:
    a, _ = aligner(idle_ms=50)
    assert a.push([Msg(0, 1000), Msg(1, 1000)]) == []  # partition 2 unheard: wait
    time.sleep(0.06)
    assert ts_of(a.push([])) == [1000, 1000]
    assert ts_of(a.push([Msg(2, 900), Msg(0, 2000)])) == [900]
    # 1 and 2 reach their ends: partition 0's record waits for them, then goes.
    assert a.push([Msg(1, eof=True), Msg(2, eof=True)]) == []
    time.sleep(0.06)
    assert ts_of(a.push([])) == [2000]


def test_all_partitions_at_end_release_everything_after_idle() -> None:
    a, _ = aligner(parts=2, idle_ms=1)
    assert ts_of(a.push([Msg(0, 10), Msg(0, 9000), Msg(1, 20), Msg(1, eof=True)])) == [10, 20]
    assert a.push([Msg(0, eof=True)]) == []
    time.sleep(0.01)
    assert ts_of(a.push([])) == [9000]
    assert a.buffered() == 0


def test_full_buffers_pause_and_drained_ones_resume() -> None:
    a, rec = aligner(parts=2)
    a.push([Msg(0, i) for i in range(alignment._MAX_BUFFERED)])
    assert rec.paused == {0}  # partition 1 unheard: everything is held, 0 is full
    a.push([Msg(1, 10**9)])
    assert rec.paused == set()
    rec.paused.add(1)
    a.reapply()
    assert rec.paused == {1}
