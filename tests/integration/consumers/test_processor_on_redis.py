"""SampleBuilder on Redis against the same builder on the in-memory store: the answers Redis
streams (several user calls a batch, read as the builder needs them) make the same samples
and dead letters, batch by batch, whatever the cuts, redos, resends, reused ids and late
events.
"""

from __future__ import annotations

import random
import re
import zlib
from collections.abc import Callable, Sequence

import pytest

from streamrec.config import ConsumerConfig, RedisStoreConfig
from streamrec.consumers.processor import SampleBuilder
from streamrec.errors import FeatureStoreLost
from streamrec.events import Event
from streamrec.featurestore import MemoryFeatureStore, RedisFeatureStore
from streamrec.kafka.records import Partition, Record

T0 = 1_511_658_000_000
LENGTH, HORIZON_MS = 5, 3_600_000


def _stream(rng: random.Random) -> list[Record]:
    """3,000 events of 700 users over two partitions: late ones, several at one time, resends,
    reused ids.
    """
    events: list[Event] = []
    for i in range(3_000):
        at = T0 + i * 400 - (rng.randrange(120_000) if rng.random() < 0.05 else 0)
        action = "pv" if rng.random() < 0.6 else "cart"
        events.append(Event(f"e{i}", f"u{rng.randrange(700)}", f"i{rng.randrange(300)}", "c", action, at))
        if rng.random() < 0.05:  # more of the user's events at the same time: one history read
            events += [Event(f"e{i}.{k}", events[-1].user_id, f"i{rng.randrange(300)}", "c", "pv", at)
                       for k in range(2)]
        if rng.random() < 0.05:
            events.append(events[rng.randrange(len(events))])  # resent
        if rng.random() < 0.02:
            old = events[rng.randrange(len(events))]
            events.append(Event(old.event_id, old.user_id, "reused", "c", "pv", old.ts))
    offsets = [0, 0]
    records = []
    for event in events:
        partition = zlib.crc32(event.user_id.encode()) % 2  # a user's events in one partition, as keyed
        records.append(Record(event.to_json(), offsets[partition], partition=partition))
        offsets[partition] += 1
    return records


def test_redis_and_memory_make_the_same_batches(store_config: RedisStoreConfig) -> None:
    rng = random.Random(11)
    records = _stream(rng)
    cfg = ConsumerConfig(negatives=2, allowed_lateness_ms=60_000, late_events="sequence_only")
    on_redis = SampleBuilder(cfg, RedisFeatureStore(store_config, LENGTH, HORIZON_MS))
    in_memory = SampleBuilder(cfg, MemoryFeatureStore(LENGTH, HORIZON_MS))
    start, batches = 0, 0
    while start < len(records):
        end = min(len(records), start + rng.randrange(300, 900))  # 1 to 4 user calls
        batch = records[start:end]
        for builder in (on_redis, in_memory):
            if rng.random() < 0.3:
                builder.process(batch, now_ms=T0 + 10**8)  # aborted: done again below
        got = [builder.process(batch, now_ms=T0 + 10**8) for builder in (on_redis, in_memory)]
        assert got[0].samples == got[1].samples, batches
        assert [(d.position, d.reason) for d in got[0].dead] == [(d.position, d.reason) for d in got[1].dead]
        assert (got[0].duplicates, got[0].late) == (got[1].duplicates, got[1].late)
        for builder, result in zip((on_redis, in_memory), got, strict=True):
            builder.commit(result)
        start, batches = end, batches + 1
    assert batches > 4 and sum(len(r.samples) for r in got) > 0


def test_a_partition_without_state_is_refused_where_the_group_committed_and_begun_where_it_never_did(
    store_config: RedisStoreConfig,
) -> None:
    """A durable store holding nothing of a partition the group committed past 0 on lost it (an
    AOF replayed without its scripts' writes): the builder asks the group's offsets only then,
    refuses with the partition and its offset, and writes nothing, so a restart refuses again.
    A partition the group never committed on is new: begun. The in-memory store is never asked.
    """
    records = [Record(Event(f"e{i}", "u1", f"i{i}", "c", "pv", T0 + i).to_json(), 5 + i, partition=1)
               for i in range(3)]
    asked: list[list[Partition]] = []

    def committed(offsets: dict[Partition, int]) -> Callable[[Sequence[Partition]], dict[Partition, int]]:
        def ask(partitions: Sequence[Partition]) -> dict[Partition, int]:
            asked.append(list(partitions))
            return {key: offsets.get(key, -1001) for key in partitions}
        return ask

    store = RedisFeatureStore(store_config, LENGTH, HORIZON_MS)
    lost = Partition("events", 1)  # the records' topic, as `Record` leaves it
    for _ in range(2):  # refused again at the next start: nothing was written
        builder = SampleBuilder(ConsumerConfig(), store)
        builder.committed = committed({lost: 5})
        with pytest.raises(FeatureStoreLost, match=re.escape(f"{lost} (committed offset 5)")) as told:
            builder.process(records, now_ms=T0)
        assert "run `streamrec consumers rebuild`" in str(told.value)
        assert store.stateless([lost]) == {lost}
        assert store.sequence("u1") == []
    assert asked == [[lost], [lost]]

    builder = SampleBuilder(ConsumerConfig(), store)
    builder.committed = committed({})  # none: a partition new to the group
    assert len(builder.process(records, now_ms=T0).samples) == 3
    assert store.stateless([lost]) == set()
    builder = SampleBuilder(ConsumerConfig(), store)  # a restart: its state found, nothing asked
    builder.committed = committed({lost: 8})
    builder.process(records, now_ms=T0)
    assert len(asked) == 3

    in_memory = SampleBuilder(ConsumerConfig(), MemoryFeatureStore(LENGTH, HORIZON_MS))
    in_memory.committed = committed({lost: 5})
    assert len(in_memory.process(records, now_ms=T0).samples) == 3
    assert len(asked) == 3
