"""The partition state (watermarks, impression windows) on Redis, a Redis Cluster and in memory:
one contract, and redone batches of any size decide exactly what a clean run decides.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

import pytest
import redis

from streamrec.config import RedisStoreConfig
from streamrec.errors import PartitionFenced
from streamrec.events import Event
from streamrec.featurestore import FeatureStore, MemoryFeatureStore, RedisFeatureStore
from streamrec.featurestore.partitions import (
    Claim,
    Decision,
    Features,
    JoinInput,
    JoinKind,
    PartitionBatch,
    SeqFeatures,
)
from streamrec.kafka.records import Partition

T0 = 1_511_658_000_000
MINUTE = 60_000
WINDOW = 10 * MINUTE
ALLOWED = 5 * MINUTE
P = Partition("events", 0)


@pytest.fixture(params=["redis", "redis-cluster", "memory"])
def store(request: pytest.FixtureRequest, unique_name: str) -> FeatureStore:
    if request.param == "memory":
        return MemoryFeatureStore(length=3)
    if request.param == "redis-cluster":
        url = request.getfixturevalue("redis_cluster_url")
        return RedisFeatureStore(RedisStoreConfig(url=url, cluster=True, key_prefix=unique_name), 3)
    cfg: RedisStoreConfig = request.getfixturevalue("store_config")
    return RedisFeatureStore(cfg, 3)


Row = tuple[JoinKind, Event]


def imp(i: int, user: str, item: str, minute: float) -> Row:
    return "impression", Event(f"i{i}", user, item, "c", "impression", T0 + int(minute * MINUTE))


def click(i: int, user: str, item: str, minute: float) -> Row:
    return "click", Event(f"k{i}", user, item, "c", "click", T0 + int(minute * MINUTE))


class Feed:
    """Runs one partition's rows through a store in batches, as the consumers do: claim at the
    start, the watermark from the newest event time so far, late clicks judged late.
    """

    def __init__(self, store: FeatureStore, partition: Partition = P, featured: bool = False) -> None:
        self.store, self.partition, self.featured = store, partition, featured
        self.epoch = 0
        self.newest: int | None = None
        self.committed = 0  # the next offset to read
        self.decided: list[Decision] = []
        self.late_labels = 0

    def claim(self) -> None:
        got = self.store.claim({self.partition: self.committed})[self.partition]
        self.epoch, self.newest = got.epoch, got.newest

    def batch(self, rows: Sequence[Row], end: int, commit: bool = True) -> list[Decision]:
        """Process rows[committed:end]; commit unless told not to (an aborted batch)."""
        newest = self.newest
        inputs = []
        for offset in range(self.committed, end):
            kind, event = rows[offset]
            watermark = T0 if newest is None else newest - ALLOWED
            late = event.ts < watermark
            newest = event.ts if newest is None else max(newest, event.ts)
            if kind == "click" and late:
                kind = "late_click"
            elif late:
                continue
            # a page: impressions of one user at one time read one history
            history = ((f"h{event.user_id}:{event.ts}",), ("c",)) if kind == "impression" else ((), ())
            if self.featured and kind == "impression":
                features, seq_features = features_of(event)
                inputs.append(JoinInput(kind, offset, event, history[0], history[1], watermark,
                                        features=features, seq_features=seq_features))
            else:
                inputs.append(JoinInput(kind, offset, event, history[0], history[1], watermark))
        assert newest is not None
        batch = PartitionBatch(self.partition, self.epoch, self.committed, end - 1, newest, ALLOWED,
                               tuple(inputs), self.featured)
        (outcome,) = self.store.advance([batch], WINDOW, WINDOW)
        if commit:
            self.committed, self.newest = end, newest
            self.decided += outcome.decisions
            self.late_labels += outcome.late_labels
        return outcome.decisions


def features_of(event: Event) -> tuple[Features, SeqFeatures]:
    """An impression's sample features (its own) and its history's (its page's), awkward values among them."""
    own: Features = {"shop": f"s\t{event.item_id}\x1f\n\u00e9", "tags": ("t", event.event_id), "price": 2.5}
    if event.event_id.endswith("3"):
        own = {}  # none known
    seq: SeqFeatures = {"shop": (f"{event.user_id}:{event.ts}", None), "tags": (("a", "b"), ())}
    return own, seq


def labels(decisions: Sequence[Decision]) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in decisions:
        assert d.event_id not in out, f"{d.event_id} decided twice"
        out[d.event_id] = d.label
    return out


def test_a_click_in_the_window_makes_a_positive_at_once_and_no_click_a_negative_at_the_watermark(
    store: FeatureStore,
) -> None:
    rows = [imp(1, "u", "a", 0), imp(2, "u", "b", 0), click(3, "u", "a", 2), click(4, "u", "b", 30)]
    feed = Feed(store)
    feed.claim()
    assert [(d.event_id, d.label) for d in feed.batch(rows, 3)] == [("i1", 1)]
    # the click on b at minute 30 moves the watermark to 25: b's window (0..10) closes, and
    # the click itself is outside it, so it is no click of b's impression
    assert [(d.event_id, d.label) for d in feed.batch(rows, 4)] == [("i2", 0)]
    positive = feed.decided[0]
    assert (positive.user_id, positive.item_id, positive.ts, positive.items) == ("u", "a", T0, (f"hu:{T0}",))


def test_the_latest_impression_before_a_click_takes_it_and_a_second_click_takes_nothing(
    store: FeatureStore,
) -> None:
    rows = [imp(1, "u", "a", 0), imp(2, "u", "a", 1), click(3, "u", "a", 2), click(4, "u", "a", 3),
            click(5, "u", "x", 40)]
    feed = Feed(store)
    feed.claim()
    feed.batch(rows, len(rows))
    assert labels(feed.decided) == {"i2": 1, "i1": 0}


def test_a_click_after_its_window_closed_is_a_late_label_and_no_sample(store: FeatureStore) -> None:
    rows = [imp(1, "u", "a", 0), click(2, "u", "z", 22), click(3, "u", "a", 5), click(4, "u", "q", 5)]
    feed = Feed(store)
    feed.claim()
    feed.batch(rows, 2)
    decisions = feed.batch(rows, 4)
    assert decisions == []
    assert labels(feed.decided) == {"i1": 0}
    assert feed.late_labels == 1  # the click on a; the one on q had no impression


def test_an_undone_batch_is_redone_in_other_sizes_with_the_same_decisions(store: FeatureStore) -> None:
    rows = [imp(1, "u", "a", 0), imp(2, "v", "b", 1), click(3, "u", "a", 4), click(4, "v", "z", 30),
            imp(5, "u", "c", 31), click(6, "u", "c", 32), click(7, "u", "y", 60)]
    clean = Feed(store, Partition("clean", 0))
    clean.claim()
    clean.batch(rows, len(rows))

    feed = Feed(store)
    feed.claim()
    feed.batch(rows, 2)
    feed.batch(rows, 7, commit=False)  # aborted after the store changed
    feed.batch(rows, 4, commit=False)  # and its redo too
    feed.claim()  # a restart: a new epoch, the watermark as of the committed offset
    assert feed.newest == T0 + MINUTE
    feed.batch(rows, 5)
    feed.batch(rows, 7)
    assert labels(feed.decided) == labels(clean.decided) == {"i1": 1, "i2": 0, "i5": 1}
    assert [d.event_id for d in feed.decided] == ["i1", "i2", "i5"]


def test_a_batch_from_an_older_claim_is_refused_and_changes_nothing(store: FeatureStore) -> None:
    rows = [imp(1, "u", "a", 0), click(2, "u", "a", 1)]
    stalled, taker = Feed(store), Feed(store)
    stalled.claim()
    taker.claim()
    with pytest.raises(PartitionFenced, match="another consumer"):
        stalled.batch(rows, 2)
    taker.batch(rows, 2)
    assert labels(taker.decided) == {"i1": 1}


def test_claims_are_checked_before_a_commit_as_of_the_epochs_they_were_made_at(store: FeatureStore) -> None:
    other = Partition("events", 1)
    first = store.claim({P: 0, other: 0})
    ours = {key: claim.epoch for key, claim in first.items()}
    store.check_claims(ours)  # nobody took them since
    store.check_claims({})
    taken = store.claim({other: 0})[other].epoch  # another consumer takes one over
    told = re.escape(f"partition {other}, epoch {taken}, ours {ours[other]}")
    with pytest.raises(PartitionFenced, match=told):
        store.check_claims(ours)
    store.check_claims({P: ours[P], other: taken})
    with pytest.raises(PartitionFenced):
        store.check_claims({Partition("events", 9): 1})  # never claimed


def test_the_watermark_is_read_as_of_the_offset_a_claim_starts_from(store: FeatureStore) -> None:
    rows = [click(1, "u", "a", 0), click(2, "u", "a", 9), click(3, "u", "a", 20)]
    feed = Feed(store)
    feed.claim()
    assert feed.newest is None
    feed.batch(rows, 2)
    feed.batch(rows, 3, commit=False)
    feed.claim()
    assert feed.newest == T0 + 9 * MINUTE


@pytest.mark.parametrize("seed", range(3))
def test_random_streams_decide_alike_whatever_the_batches_aborts_and_restarts(
    store: FeatureStore, seed: int
) -> None:
    rng = random.Random(seed)
    rows: list[Row] = []
    minute = 0.0
    while len(rows) < 300:
        minute += rng.random()
        at = minute - rng.random() * 8  # out of order, sometimes late
        user, item = rng.choice("uvw"), rng.choice("abcd")
        if rng.random() < 0.15:  # a page: impressions of one user at one time, one history
            rows += [imp(len(rows) + k, user, shown, at) for k, shown in enumerate(rng.sample("abcd", 3))]
        else:
            i = len(rows)
            rows.append(imp(i, user, item, at) if rng.random() < 0.6 else click(i, user, item, at))

    clean = Feed(store, Partition("clean", seed))
    clean.claim()
    for end in range(25, len(rows) + 25, 25):
        clean.batch(rows, min(end, len(rows)))

    feed = Feed(store, Partition("chaos", seed))
    feed.claim()
    while feed.committed < len(rows):
        end = min(len(rows), feed.committed + rng.randint(1, 60))
        fate = rng.random()
        if fate < 0.2:
            feed.batch(rows, min(len(rows), end + rng.randint(0, 30)), commit=False)
        elif fate < 0.3:
            feed.batch(rows, end, commit=False)
            feed.claim()
        feed.batch(rows, end)
    assert labels(feed.decided) == labels(clean.decided)
    assert feed.late_labels == clean.late_labels
    reference = Feed(MemoryFeatureStore(length=3))  # the store's own parity with the memory one
    reference.claim()
    reference.batch(rows, len(rows))
    assert labels(reference.decided) == labels(clean.decided)
    by_id = sorted(reference.decided, key=lambda d: d.event_id)
    assert by_id == sorted(clean.decided, key=lambda d: d.event_id)  # histories too
    assert reference.late_labels == clean.late_labels
    assert 0 < sum(d.label for d in clean.decided) < len(clean.decided)
    assert sorted(feed.decided, key=lambda d: d.event_id) == sorted(clean.decided, key=lambda d: d.event_id)


def test_redis_keeps_a_pages_history_once_and_forgets_it_with_its_last_window(
    store_config: RedisStoreConfig, redis_client: redis.Redis,
) -> None:
    store = RedisFeatureStore(store_config, 3)
    epoch = store.claim({P: 0})[P].epoch
    page = [JoinInput("impression", k, imp(k, "u", f"i{k}", 0)[1], ("a", "b"), ("c", "c")) for k in range(4)]
    odd = JoinInput("impression", 4, imp(4, "u", "i4", 0)[1], ("z",), ("c",))  # same time, other history
    store.advance([PartitionBatch(P, epoch, 0, 4, T0, ALLOWED, (*page, odd))], WINDOW, WINDOW)
    hist = f"{store_config.key_prefix}:hist:{{{P.topic}:{P.partition}}}"
    assert sorted(redis_client.hvals(hist)) == [b"a\x1db\x1cc\x1dc", b"z\x1cc"]
    late = T0 + 3 * WINDOW + ALLOWED  # closes every window, then forgets them a batch later
    (closed,) = store.advance([PartitionBatch(P, epoch, 5, 5, late, ALLOWED)], WINDOW, WINDOW)
    assert sorted((d.event_id, d.items) for d in closed.decisions) == [
        ("i0", ("a", "b")), ("i1", ("a", "b")), ("i2", ("a", "b")), ("i3", ("a", "b")), ("i4", ("z",))
    ]
    store.advance([PartitionBatch(P, epoch, 6, 6, late, ALLOWED)], WINDOW, WINDOW)
    assert redis_client.hlen(hist) == 0
    assert redis_client.hlen(f"{store_config.key_prefix}:refs:{{{P.topic}:{P.partition}}}") == 0


def test_an_impression_id_seen_again_opens_no_second_window_and_its_history_goes_with_the_first(
    store_config: RedisStoreConfig, redis_client: redis.Redis,
) -> None:
    store = RedisFeatureStore(store_config, 3)
    epoch = store.claim({P: 0})[P].epoch
    history = (("a",), ("c",))
    page = [JoinInput("impression", k, imp(k, "u", f"i{k}", 0)[1], *history) for k in range(2)]
    again = JoinInput("impression", 2, imp(0, "u", "i0", 0)[1], *history)  # i0 again, in the page
    store.advance([PartitionBatch(P, epoch, 0, 2, T0, ALLOWED, (*page, again))], WINDOW, WINDOW)
    later = JoinInput("impression", 3, imp(1, "u", "i1", 0)[1], *history)  # i1 again, a batch later
    store.advance([PartitionBatch(P, epoch, 3, 3, T0, ALLOWED, (later,))], WINDOW, WINDOW)
    refs = f"{store_config.key_prefix}:refs:{{{P.topic}:{P.partition}}}"
    assert [int(v) for v in redis_client.hvals(refs)] == [2]  # held by the two windows
    late = T0 + 3 * WINDOW + ALLOWED
    (closed,) = store.advance([PartitionBatch(P, epoch, 4, 4, late, ALLOWED)], WINDOW, WINDOW)
    assert sorted(d.event_id for d in closed.decisions) == ["i0", "i1"]
    store.advance([PartitionBatch(P, epoch, 5, 5, late, ALLOWED)], WINDOW, WINDOW)
    assert redis_client.hlen(refs) == 0
    assert redis_client.hlen(f"{store_config.key_prefix}:hist:{{{P.topic}:{P.partition}}}") == 0


def test_a_page_whose_first_impression_is_open_already_keeps_its_history_for_the_next(
    store: FeatureStore,
) -> None:
    epoch = store.claim({P: 0})[P].epoch
    first = JoinInput("impression", 0, imp(0, "u", "i0", 0)[1], ("a",), ("c",))
    store.advance([PartitionBatch(P, epoch, 0, 0, T0, ALLOWED, (first,))], WINDOW, WINDOW)
    at = imp(0, "u", "i0", 1)[1]  # a page a minute later, led by i0 again (open already)
    page = [JoinInput("impression", 1, at, ("b",), ("c",)),
            JoinInput("impression", 2, imp(2, "u", "i2", 1)[1], ("b",), ("c",))]
    store.advance([PartitionBatch(P, epoch, 1, 2, at.ts, ALLOWED, tuple(page))], WINDOW, WINDOW)
    late = T0 + 3 * WINDOW + ALLOWED
    (closed,) = store.advance([PartitionBatch(P, epoch, 3, 3, late, ALLOWED)], WINDOW, WINDOW)
    assert sorted((d.event_id, d.items) for d in closed.decisions) == [("i0", ("a",)), ("i2", ("b",))]


def test_windows_keep_their_impressions_features_for_their_decisions_whatever_the_batches(
    store: FeatureStore,
) -> None:
    rng = random.Random(5)
    rows: list[Row] = []
    minute = 0.0
    while len(rows) < 200:
        minute += rng.random()
        user = rng.choice("uvw")
        if rng.random() < 0.2:  # a page: one history, each impression its own features
            rows += [imp(len(rows) + k, user, shown, minute) for k, shown in enumerate(rng.sample("abcd", 3))]
        else:
            i = len(rows)
            item = rng.choice("abcd")
            rows.append(imp(i, user, item, minute) if rng.random() < 0.6 else click(i, user, item, minute))
    rows.append(click(len(rows), "x", "z", minute + 60))  # closes every window
    feed = Feed(store, Partition("featured", 0), featured=True)
    feed.claim()
    while feed.committed < len(rows):
        end = min(len(rows), feed.committed + rng.randint(1, 40))
        if rng.random() < 0.3:
            feed.batch(rows, min(len(rows), end + rng.randint(0, 30)), commit=False)
        feed.batch(rows, end)
    impressions = {event.event_id: event for kind, event in rows if kind == "impression"}
    assert sorted(d.event_id for d in feed.decided) == sorted(impressions)
    assert {d.label for d in feed.decided} == {0, 1}
    for d in feed.decided:
        assert (d.features, d.seq_features) == features_of(impressions[d.event_id]), d.event_id


def test_redis_keeps_no_features_for_the_default_schema_and_forgets_them_with_their_windows(
    store_config: RedisStoreConfig, redis_client: redis.Redis,
) -> None:
    store = RedisFeatureStore(store_config, 3)
    feat = f"{store_config.key_prefix}:feat:{{{P.topic}:{P.partition}}}"
    feed = Feed(store)
    feed.claim()
    rows = [imp(0, "u", "a", 0), imp(1, "u", "b", 0), click(2, "u", "a", 1)]
    feed.batch(rows, 3)
    assert not redis_client.exists(feat)
    featured = Feed(store, Partition(P.topic, 1), featured=True)
    featured.claim()
    featured.batch(rows, 3)
    feat = f"{store_config.key_prefix}:feat:{{{P.topic}:1}}"
    assert redis_client.hlen(feat) == 2
    late = [*rows, click(3, "x", "z", 60), click(4, "x", "z", 90)]  # closes, then forgets
    featured.batch(late, 4)
    featured.batch(late, 5)
    assert not redis_client.exists(feat)


def test_a_claim_told_not_to_create_writes_nothing_for_a_partition_without_state(store: FeatureStore) -> None:
    """The consumers claim with ``create=False`` first: a durable store that holds nothing of a
    partition says so and writes nothing (a refusal stays a refusal at the next start); the
    in-memory store lives with its process, so it always starts one afresh and never says so.
    """
    other = Partition("events", 1)
    store.claim({P: 0})
    got = store.claim({P: 0, other: 0}, create=False)
    assert got[P].found and got[P].epoch == 2
    if not store.durable:
        assert got[other].found is False and got[other].epoch == 1  # started all the same
        return
    assert got[other] == Claim(0, None, found=False)
    assert store.stateless([P, other]) == {other}  # nothing was written
    assert store.claim({other: 0})[other] == Claim(1, None, found=False)  # now created
    assert store.stateless([P, other]) == set()


def test_a_partitions_own_record_has_no_ttl_after_a_claim_or_a_batch(
    store_config: RedisStoreConfig, redis_client: redis.Redis,
) -> None:
    """The ``part`` hash (epoch, watermark) is kept for good: its absence where the group
    committed tells a lost partition, so it must not expire after 30 idle days. The windows keep
    their TTL. A store written by an earlier version gave ``part`` a TTL: a claim, or the
    consumers' check at start (`stateless`), removes it.
    """
    store = RedisFeatureStore(store_config, 3)
    part, win = (f"{store_config.key_prefix}:{name}:{{events:0}}" for name in ("part", "win"))
    feed = Feed(store)
    feed.claim()
    assert redis_client.pttl(part) == -1
    feed.batch([imp(1, "u", "a", 0), click(2, "u", "b", 1)], 2)
    assert redis_client.pttl(part) == -1
    assert 0 < redis_client.pttl(win) <= store_config.ttl_s * 1000
    redis_client.pexpire(part, 60_000)  # as the previous version left it
    feed.claim()
    assert redis_client.pttl(part) == -1
    redis_client.pexpire(part, 60_000)
    assert store.stateless([P, Partition("events", 1)]) == {Partition("events", 1)}
    assert redis_client.pttl(part) == -1
