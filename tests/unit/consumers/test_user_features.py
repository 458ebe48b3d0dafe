"""User features (role ``user``) joined into samples point in time by the sample builder."""

from __future__ import annotations

import random
from typing import Any

import orjson

from streamrec.config import ConsumerConfig
from streamrec.consumers.processor import SampleBuilder
from streamrec.features.schema import FeatureSchema, FeatureSpec
from streamrec.featurestore.memory import MemoryFeatureStore
from streamrec.featurestore.profiles import MemoryProfileStore
from streamrec.kafka.records import Record
from streamrec.samples import Sample

T0 = 1_700_000_000_000
SCHEMA = FeatureSchema.of(
    [
        FeatureSpec(name="tier", field="membership", role="user"),
        FeatureSpec(name="device", role="context"),
    ]
)


def click(k: int, seconds: int, tier: str | None = None, user: str = "u1") -> dict[str, Any]:
    doc: dict[str, Any] = {
        "event_id": f"e{k}",
        "user_id": user,
        "item_id": f"i{k}",
        "category_id": "c1",
        "action": "pv",
        "ts": T0 + seconds * 1000,
    }
    if tier is not None:
        doc["membership"] = tier
    return doc


def records(docs: list[dict[str, Any]], first: int = 0) -> list[Record]:
    return [Record(orjson.dumps(d), first + i) for i, d in enumerate(docs)]


def builder(negatives: int = 1, schema: FeatureSchema = SCHEMA) -> SampleBuilder:
    return SampleBuilder(
        ConsumerConfig(negatives=negatives),
        MemoryFeatureStore(length=50),
        profiles=MemoryProfileStore(points=4),
        schema=schema,
    )


def run(b: SampleBuilder, docs: list[dict[str, Any]], first: int = 0) -> list[Sample]:
    result = b.process(records(docs, first), now_ms=T0 + 10**6)
    b.commit(result)
    assert [Sample.from_json(v) for v in result.values] == result.samples  # what is sent is what was made
    return result.samples


def tiers(samples: list[Sample]) -> dict[str, object]:
    return {s.sample_id: s.features.get("tier") for s in samples}


def test_a_sample_and_its_negatives_get_the_users_value_as_of_its_time() -> None:
    b = builder()
    run(b, [click(0, 0, user="other")])  # an item in the pool, for negatives
    got = run(b, [click(1, 10, "silver"), click(2, 20), click(3, 30, "gold"), click(4, 40)])
    assert tiers(got) == {
        "e1": "silver",
        "e1~n0": "silver",
        "e2": "silver",
        "e2~n0": "silver",
        "e3": "gold",
        "e3~n0": "gold",
        "e4": "gold",
        "e4~n0": "gold",
    }


def test_a_later_value_never_leaks_into_an_earlier_sample() -> None:
    """Gold, stamped later, arrives first; the earlier events, arriving after it, read their own time."""
    b = builder(negatives=0)
    assert tiers(run(b, [click(3, 30, "gold")])) == {"e3": "gold"}
    got = run(b, [click(1, 10, "silver"), click(2, 20), click(0, 5)], first=1)
    assert tiers(got) == {"e0": None, "e1": "silver", "e2": "silver"}  # e0: nothing yet, the default


def test_a_redone_batch_gets_the_same_values() -> None:
    b = builder()
    run(b, [click(0, 0, user="other")])
    batch = [click(1, 10, "silver"), click(2, 20, "gold")]
    first = b.process(records(batch, 1), now_ms=T0 + 10**6)  # aborted: not committed
    again = b.process(records(batch, 1), now_ms=T0 + 10**6)
    assert again.values == first.values
    assert tiers(again.samples) == {"e1": "silver", "e1~n0": "silver", "e2": "gold", "e2~n0": "gold"}


def test_an_event_id_reused_for_other_content_writes_no_user_feature() -> None:
    """A conflict is dead-lettered whole: its user features reach no profile, in its batch or later."""
    b = builder(negatives=0)
    run(b, [click(1, 10, "silver")])
    reused = click(1, 20, "gold")  # e1 again, another time and another tier: a conflict
    reused["item_id"] = "i9"
    result = b.process(records([reused, click(2, 30)], first=1), now_ms=T0 + 10**6)
    b.commit(result)
    assert [d.reason for d in result.dead] and "e1" not in tiers(result.samples)
    assert tiers(result.samples) == {"e2": "silver"}  # the conflict's gold never counted
    assert tiers(run(b, [click(3, 40)], first=3)) == {"e3": "silver"}


def test_a_bad_user_value_dead_letters_its_event_naming_the_feature() -> None:
    b = builder(negatives=0)
    bad = click(1, 10)
    bad["membership"] = ["not", "an id"]
    result = b.process(records([bad, click(2, 20, "gold")]), now_ms=T0 + 10**6)
    assert [s.sample_id for s in result.samples] == ["e2"]
    assert len(result.dead) == 1 and "feature 'tier'" in result.dead[0].reason


def test_without_user_features_samples_are_as_before() -> None:
    plain = SampleBuilder(ConsumerConfig(negatives=0), MemoryFeatureStore(length=50))
    hooked = builder(negatives=0, schema=FeatureSchema.default())
    docs = [click(1, 10, "silver"), click(2, 20)]
    before, after = (b.process(records(docs), now_ms=T0 + 10**6) for b in (plain, hooked))
    assert after.values == before.values and len(after.values) == 2
    assert all(b'"features"' not in value for value in after.values)


def test_random_streams_never_leak_a_later_value() -> None:
    """Oracle: a sample's tier is the newest stamped at or before its time among the events that
    arrived by the end of its batch (ties: the greatest JSON), whatever the order and the cuts.
    """
    rng = random.Random(5)
    docs = []
    for k in range(1_500):
        doc = click(k, k - (rng.randrange(40) if rng.random() < 0.2 else 0), f"u{rng.randrange(40)}")
        if rng.random() < 0.6:
            doc["membership"] = rng.choice(["basic", "silver", "gold"])
        docs.append(doc)
    b = SampleBuilder(
        ConsumerConfig(negatives=1),
        MemoryFeatureStore(length=50),
        profiles=MemoryProfileStore(points=10_000),
        schema=SCHEMA,
    )
    arrived: list[dict[str, Any]] = []
    start, checked = 0, 0
    while start < len(docs):
        end = min(len(docs), start + rng.randrange(1, 200))
        arrived += docs[start:end]
        for sample in run(b, docs[start:end], first=start):
            known = [
                (d["ts"], orjson.dumps(d["membership"]), d["membership"])
                for d in arrived
                if d["user_id"] == sample.user_id and "membership" in d and d["ts"] <= sample.ts
            ]
            assert sample.features.get("tier") == (max(known)[2] if known else None), sample.sample_id
            checked += 1
        start = end
    assert checked > 2_000


def test_a_user_with_more_events_in_one_batch_than_points_kept_reads_each_events_own_value() -> None:
    """In order, one batch: the store keeps 4 points, the user has 7 events, each its own tier.

    The batch's points were written before its samples read them, so the 3 earliest samples,
    older than every point kept, read nothing (the MovieLens example: 74,005 of 100,004 samples
    lacked the rater's history, users rating dozens of movies within one consumer batch).
    """
    b = builder(negatives=0)
    got = run(b, [click(k, 10 * k, f"t{k}") for k in range(7)])
    assert tiers(got) == {f"e{k}": f"t{k}" for k in range(7)}
    # the next batch reads what the store kept: the 4 newest, and a sample at its time
    assert tiers(run(b, [click(7, 70)], first=7)) == {"e7": "t6"}


def test_a_redone_batch_of_more_events_than_points_gets_the_same_values() -> None:
    b = builder(negatives=0)
    batch = [click(k, 10 * k, f"t{k}") for k in range(7)]
    first = b.process(records(batch), now_ms=T0 + 10**6)  # aborted: not committed, the points written
    again = b.process(records(batch), now_ms=T0 + 10**6)
    assert again.values == first.values
    assert tiers(again.samples) == {f"e{k}": f"t{k}" for k in range(7)}
