"""Declared features in the ``join`` mode: decided samples carry what the sampled mode gives.

The impression's target behaviour values (outcomes aside) and context, the user's values as of
its time and its history's behaviour values, kept in its window until its label is decided;
on the in-memory store (the Redis one: tests/integration/consumers/test_join_features.py).
"""

from __future__ import annotations

from typing import Any

import orjson

from streamrec.config import ConsumerConfig
from streamrec.consumers.processor import SampleBuilder
from streamrec.features.schema import FeatureSchema, FeatureSpec
from streamrec.featurestore import FeatureStore
from streamrec.featurestore.memory import MemoryFeatureStore
from streamrec.featurestore.profiles import MemoryProfileStore
from streamrec.kafka.records import Record
from streamrec.samples import Sample

T0 = 1_511_658_000_000
MINUTE = 60_000
WINDOW = 10 * MINUTE
JOIN = {"labels": "join", "label_window_ms": WINDOW, "allowed_lateness_ms": 5 * MINUTE, "negatives": 0}
NOW = 2_000_000_000_000
SCHEMA = FeatureSchema.of([
    FeatureSpec(name="shop"),
    FeatureSpec(name="tags", kind="ids"),
    FeatureSpec(name="rating", kind="number", outcome=True),
    FeatureSpec(name="tier", field="membership", role="user"),
    FeatureSpec(name="device", role="context"),
])


def doc(eid: str, item: str, minute: float, action: str = "impression", **fields: Any) -> dict[str, Any]:
    return {"event_id": eid, "user_id": "u", "item_id": item, "category_id": f"c{item}", "action": action,
            "ts": T0 + int(minute * MINUTE), **fields}


#: Behaviours with features and a user feature changing over time, then a page of two
#: impressions (one clicked), a later tier the impressions must not see, and time passing.
BEFORE = [
    doc("v1", "x", -3, "pv", shop="s1", tags=["t1", "t2"], rating=4.0, membership="silver", device="web"),
    doc("v2", "y", -2, "pv", shop="s2", device="ios"),
]
PAGE = [
    doc("s1", "a", 0, shop="sa", tags=["ta"], rating=5.0, device="tv"),
    doc("s2", "b", 0, shop="sb", device="tv"),
]
AFTER = [
    doc("k", "a", 1, "click", shop="sa", device="tv"),
    doc("later", "z", 2, "pv", membership="gold", device="web"),
    doc("tick", "w", 30, "pv", device="web"),  # the watermark passes the page's windows
]


def builder(store: FeatureStore | None = None, **cfg: object) -> SampleBuilder:
    store = store or MemoryFeatureStore(length=5, schema=SCHEMA)
    return SampleBuilder(ConsumerConfig(**{**JOIN, **cfg}), store, schema=SCHEMA,
                         profiles=MemoryProfileStore(points=4))


def run(b: SampleBuilder, docs: list[dict[str, Any]], first: int = 0) -> list[Sample]:
    result = b.process([Record(orjson.dumps(d), first + k) for k, d in enumerate(docs)], now_ms=NOW)
    b.commit(result)
    assert [Sample.from_json(v) for v in result.values] == result.samples  # what is sent is what was made
    return result.samples


def expected(*labels: int) -> list[Sample]:
    """What the sampled mode makes of the page's impressions, each labelled explicitly."""
    b = builder(labels="sampled")
    run(b, BEFORE)
    page = [{**d, "label": label} for d, label in zip(PAGE, labels, strict=True)]
    return run(b, page, len(BEFORE))


def decided(samples: list[Sample]) -> dict[str, Sample]:
    return {s.sample_id: s for s in samples if s.sample_id in ("s1", "s2")}


def test_decided_samples_carry_the_features_the_sampled_mode_gives_the_same_impression() -> None:
    want = {s.sample_id: s for s in expected(1, 0)}
    assert want["s1"].features == {"shop": "sa", "tags": ("ta",), "tier": "silver", "device": "tv"}
    assert want["s1"].seq_features == {
        "shop": ("s1", "s2"), "tags": (("t1", "t2"), None), "rating": (4.0, None)
    }
    b = builder()
    got = decided(run(b, BEFORE + PAGE + AFTER))
    assert got == want


def test_decided_samples_carry_their_features_across_batches() -> None:
    """A window opened in one batch and decided in later ones keeps its values as of its time."""
    b = builder()
    got: dict[str, Sample] = {}
    first = 0
    for batch in (BEFORE, PAGE, AFTER[:1], AFTER[1:2], AFTER[2:]):
        got |= decided(run(b, batch, first))
        first += len(batch)
    assert got == {s.sample_id: s for s in expected(1, 0)}


def test_the_default_schema_decides_what_it_did() -> None:
    b = SampleBuilder(ConsumerConfig(**JOIN), MemoryFeatureStore(length=5))
    docs = [{k: v for k, v in d.items() if k in ("event_id", "user_id", "item_id", "category_id", "action",
                                                  "ts")} for d in BEFORE + PAGE + AFTER]
    result = b.process([Record(orjson.dumps(d), k) for k, d in enumerate(docs)], now_ms=NOW)
    s1 = next(s for s in result.samples if s.sample_id == "s1")
    assert s1.to_json() == (
        b'{"sample_id":"s1","user_id":"u","ts":1511658000000,"item_id":"a","category_id":"ca","label":1,'
        b'"seq_items":["x","y"],"seq_categories":["cx","cy"]}'
    )
