"""SampleBuilder with declared features: samples carry them point-in-time; on the in-memory store."""

from __future__ import annotations

import pytest

from streamrec.config import ConsumerConfig
from streamrec.consumers.processor import SampleBuilder
from streamrec.events import Event
from streamrec.features.schema import FeatureSchema, FeatureSpec, Value
from streamrec.featurestore.memory import MemoryFeatureStore
from streamrec.kafka.records import Record

T0 = 1_511_658_000_000
SCHEMA = FeatureSchema.of([
    FeatureSpec(name="shop"),
    FeatureSpec(name="tags", kind="ids"),
    FeatureSpec(name="rating", kind="number", outcome=True),
    FeatureSpec(name="device", role="context", required=True),
])


def builder(schema: FeatureSchema = SCHEMA, **cfg: object) -> SampleBuilder:
    return SampleBuilder(ConsumerConfig(**cfg), MemoryFeatureStore(length=3, schema=schema))


def ev(eid: str, user: str, item: str, t: int, label: int | None = None, **features: Value) -> Event:
    return Event(eid, user, item, f"c{item}", "pv", T0 + t * 1000, label, features=features)


def records(*events: Event) -> list[Record]:
    return [Record(e.to_json(SCHEMA), i) for i, e in enumerate(events)]


def test_samples_carry_the_targets_and_the_historys_features_as_of_their_time() -> None:
    evs = [
        ev("a", "u", "i1", 0, shop="s1", tags=["x", "y"], rating=4.5, device="ios"),  # type: ignore[arg-type]
        ev("b", "u", "i2", 1, shop="s2", device="web"),
        ev("c", "u", "i3", 2, shop="s3", rating=1.0, device="ios"),
    ]
    result = builder(negatives=0).process(records(*evs), now_ms=T0 + 10_000)
    a, b, c = result.samples
    assert a.features == {"shop": "s1", "tags": ("x", "y"), "device": "ios"}  # its rating is its label's
    assert a.seq_features == {}  # nothing before it
    assert b.features == {"shop": "s2", "device": "web"}
    assert b.seq_features == {"shop": ("s1",), "tags": (("x", "y"),), "rating": (4.5,)}
    assert c.seq_items == ("i1", "i2")
    assert c.seq_features == {"shop": ("s1", "s2"), "tags": (("x", "y"), None), "rating": (4.5, None)}


def test_negatives_take_their_items_values_and_their_events_context() -> None:
    b = builder(negatives=1)
    seen = [ev(f"p{k}", f"v{k}", "pool", k, shop="s-pool", rating=2.0, device="web") for k in range(3)]
    b.commit(b.process(records(*seen), now_ms=T0 + 10_000))
    result = b.process(records(ev("q", "u", "i9", 5, shop="s9", device="tv")), now_ms=T0 + 10_000)
    positive, negative = result.samples
    assert negative.item_id == "pool" and negative.label == 0
    assert negative.features == {"shop": "s-pool", "device": "tv"}  # never its outcome
    assert positive.features == {"shop": "s9", "device": "tv"}


def test_mixed_negatives_from_the_history_take_the_values_stored_with_it() -> None:
    b = builder(negatives=1, negative_history_share=1.0)
    result = b.process(records(
        ev("a", "u", "i1", 0, shop="s1", rating=3.0, device="web"),
        ev("b", "u", "i2", 1, shop="s2", device="web"),
    ), now_ms=T0 + 10_000)
    negative = next(s for s in result.samples if s.label == 0)
    assert negative.item_id == "i1" and negative.features == {"shop": "s1", "device": "web"}


def test_a_bad_declared_value_is_dead_lettered_naming_the_feature() -> None:
    raw = [
        b'{"event_id":"a","user_id":"u","item_id":"i","category_id":"c","action":"pv","ts":%d,"device":"ios",'
        b'"tags":"x"}' % T0,
        b'{"event_id":"b","user_id":"u","item_id":"i","category_id":"c","action":"pv","ts":%d}' % T0,
    ]
    result = builder().process([Record(r, k) for k, r in enumerate(raw)], now_ms=T0)
    assert [d.reason for d in result.dead] == [
        "feature 'tags' (field 'tags') must be a list of ids, got str",
        "feature 'device' is required: field 'device' is missing",
    ]


def test_a_builder_refuses_a_store_keeping_other_features() -> None:
    with pytest.raises(ValueError, match="other behaviour features"):
        SampleBuilder(ConsumerConfig(), MemoryFeatureStore(length=3), schema=SCHEMA)


def test_the_default_schema_makes_the_samples_it_always_made() -> None:
    evs = [Event(f"e{k}", "u", f"i{k % 3}", "c", "pv", T0 + k) for k in range(6)]
    plain = builder(FeatureSchema.default(), negatives=2).process(
        [Record(e.to_json(), k) for k, e in enumerate(evs)], now_ms=T0 + 10)
    assert all(not s.features and not s.seq_features for s in plain.samples)
    assert b'features' not in b"".join(plain.values)
