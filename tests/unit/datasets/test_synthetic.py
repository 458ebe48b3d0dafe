"""Tests for ``streamrec.datasets.synthetic``: a seeded click stream with Taobao's shape."""

from __future__ import annotations

import collections
import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import msgspec
import numpy as np
import orjson
import pytest

from streamrec.datasets.sources import synthetic_spec
from streamrec.datasets.synthetic import (
    DEVICES,
    ClickStreamSpec,
    device_of,
    generate_clicks,
    generate_rows,
    item_debuts,
)
from streamrec.errors import ConfigError, DatasetError
from streamrec.events import Event
from streamrec.features import FeatureSchema, FeatureSpec

SPEC = ClickStreamSpec()
TEN_MINUTES_MS = 600_000


@pytest.fixture(scope="module")
def events() -> list[Event]:
    return generate_clicks(SPEC)


def _first_seen(events: list[Event]) -> dict[str, int]:
    first: dict[str, int] = {}
    for event in events:
        first.setdefault(event.item_id, event.ts)
    return first


def _by_user(events: list[Event]) -> dict[str, list[Event]]:
    grouped: dict[str, list[Event]] = collections.defaultdict(list)
    for event in events:
        grouped[event.user_id].append(event)
    return grouped


def _with_categories(events: list[Event], categories: list[str]) -> list[Event]:
    return [msgspec.structs.replace(e, category_id=c) for e, c in zip(events, categories, strict=True)]


def _shuffled_categories(events: list[Event]) -> list[Event]:
    """The same events with categories permuted across them: no user preference left."""
    categories = [e.category_id for e in events]
    order = np.random.default_rng(12345).permutation(len(categories))
    return _with_categories(events, [categories[i] for i in order])


def _top3_share(events: list[Event]) -> float:
    """Share of events in their user's three most-clicked categories."""
    counts = [collections.Counter(e.category_id for e in evs) for evs in _by_user(events).values()]
    return sum(n for c in counts for _, n in c.most_common(3)) / len(events)


def _next_in_recent(events: list[Event], window: int = 5) -> float:
    """Share of events whose category is among the user's previous ``window`` categories."""
    hits = total = 0
    for evs in _by_user(events).values():
        for i in range(1, len(evs)):
            total += 1
            hits += evs[i].category_id in {e.category_id for e in evs[max(0, i - window) : i]}
    return hits / total


def _digest(events: list[Event]) -> str:
    return hashlib.sha256(b"\n".join(e.to_json() for e in events)).hexdigest()


def test_same_seed_same_events_other_seed_differs(events: list[Event]) -> None:
    assert generate_clicks(ClickStreamSpec()) == events
    other = generate_clicks(ClickStreamSpec(seed=1))
    assert len(other) == len(events)
    assert [(e.user_id, e.item_id, e.ts) for e in other] != [(e.user_id, e.item_id, e.ts) for e in events]
    assert other[0].event_id == "g1-0"


def test_same_stream_in_another_process_with_another_hash_seed() -> None:
    spec = ClickStreamSpec(events=2_000, seed=3)
    code = (
        "from streamrec.datasets.synthetic import ClickStreamSpec, generate_clicks\n"
        "import hashlib\n"
        "events = generate_clicks(ClickStreamSpec(events=2_000, seed=3))\n"
        "print(hashlib.sha256(b'\\n'.join(e.to_json() for e in events)).hexdigest())\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "4242"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == _digest(generate_clicks(spec))


def test_count_order_bounds_and_ids(events: list[Event]) -> None:
    assert len(events) == SPEC.events
    stamps = [e.ts for e in events]
    assert stamps == sorted(stamps)
    assert SPEC.start_ms <= stamps[0] and stamps[-1] <= SPEC.start_ms + SPEC.duration_ms
    assert [e.event_id for e in events] == [f"g0-{n}" for n in range(len(events))]
    assert all(e.label is None for e in events)
    assert all(re.fullmatch(r"u\d+", e.user_id) for e in events)
    assert all(re.fullmatch(r"i\d+", e.item_id) for e in events)
    assert all(re.fullmatch(r"c\d+", e.category_id) for e in events)
    assert len({e.user_id for e in events}) == SPEC.users
    assert len({e.category_id for e in events}) == SPEC.categories


def test_every_item_has_exactly_one_category(events: list[Event]) -> None:
    categories: dict[str, set[str]] = collections.defaultdict(set)
    for event in events:
        categories[event.item_id].add(event.category_id)
    assert all(len(cats) == 1 for cats in categories.values())
    assert len(categories) <= SPEC.items


def test_item_popularity_is_heavy_tailed(events: list[Event]) -> None:
    counts = sorted(collections.Counter(e.item_id for e in events).values(), reverse=True)
    top = sum(counts[: SPEC.items // 100]) / len(events)
    assert top >= 0.10  # uniform popularity would give the top 1% of items about 1-2%
    flat = generate_clicks(ClickStreamSpec(popularity_exponent=0.0))
    flat_counts = sorted(collections.Counter(e.item_id for e in flat).values(), reverse=True)
    assert sum(flat_counts[: SPEC.items // 100]) / len(flat) < top / 2


def test_new_items_debut_during_the_stream(events: list[Event]) -> None:
    debuts = item_debuts(SPEC)
    assert len(debuts) / SPEC.items == pytest.approx(SPEC.new_item_share, abs=0.01)
    first = _first_seen(events)
    assert all(first[item] == ts for item, ts in debuts.items())  # a debut is the first event
    times = sorted(debuts.values())
    assert times[0] < SPEC.start_ms + SPEC.duration_ms // 10  # debuts spread over the stream
    assert times[-1] > SPEC.start_ms + SPEC.duration_ms * 9 // 10


def test_many_pv_events_hit_items_first_seen_minutes_ago(events: list[Event]) -> None:
    first = _first_seen(events)
    views = [e for e in events if e.action == "pv"]
    fresh = sum(e.ts - first[e.item_id] < TEN_MINUTES_MS for e in views)
    assert fresh / len(views) >= 0.3


def test_users_concentrate_on_a_few_categories(events: list[Event]) -> None:
    shuffled = _shuffled_categories(events)
    assert _top3_share(events) >= _top3_share(shuffled) + 0.3


def test_recent_sequence_predicts_next_category(events: list[Event]) -> None:
    assert _next_in_recent(events) >= _next_in_recent(_shuffled_categories(events)) + 0.3


def test_user_activity_is_heavy_tailed(events: list[Event]) -> None:
    counts = sorted(collections.Counter(e.user_id for e in events).values())
    assert counts[0] >= 4
    assert counts[-1] >= 5 * counts[len(counts) // 2]


def test_user_events_come_in_bursts(events: list[Event]) -> None:
    def median_gap(evs: list[Event]) -> float:
        gaps = [b.ts - a.ts for seq in _by_user(evs).values() for a, b in zip(seq, seq[1:], strict=False)]
        return float(np.median(gaps))

    stamps = [e.ts for e in events]
    order = np.random.default_rng(7).permutation(len(stamps))
    moved = [msgspec.structs.replace(e, ts=stamps[i]) for e, i in zip(events, order, strict=True)]
    uniform = sorted(moved, key=lambda e: e.ts)  # same users and counts, times at random
    assert median_gap(events) * 10 < median_gap(uniform)


def test_action_mix_follows_the_spec(events: list[Event]) -> None:
    counts = collections.Counter(e.action for e in events)
    total = sum(w for _, w in SPEC.actions)
    for action, weight in SPEC.actions:
        assert counts[action] / len(events) == pytest.approx(weight / total, abs=0.01)
    assert set(counts) == {name for name, _ in SPEC.actions}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"users": 0}, "users"),
        ({"items": -5}, "items"),
        ({"categories": 0}, "categories"),
        ({"events": 0}, "events"),
        ({"duration_ms": 0}, "duration_ms"),
        ({"items": 10, "categories": 20}, "items"),
        ({"new_item_share": 1.5}, "new_item_share"),
        ({"new_item_share": -0.1}, "new_item_share"),
        ({"popularity_exponent": -1.0}, "popularity_exponent"),
        ({"popularity_exponent": float("nan")}, "popularity_exponent"),
        ({"actions": ()}, "actions"),
        ({"actions": (("pv",),)}, "actions"),
        ({"actions": (("pv", 0.9), ("buy", 0.0))}, "actions"),
        ({"actions": (("pv", 0.9), ("pv", 0.1))}, "actions"),
        ({"actions": (("p\tv", 1.0),)}, "actions"),
        ({"seed": -1}, "seed"),
        ({"start_ms": 1_700_000_000}, "start_ms"),
    ],
)
def test_bad_specs_raise_config_error(change: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        ClickStreamSpec(**change)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "spec",
    [
        ClickStreamSpec(events=10),  # fewer events than users, each one debuts an item
        ClickStreamSpec(events=300, items=100, categories=100, new_item_share=1.0),
        ClickStreamSpec(events=300, new_item_share=0.0, popularity_exponent=0.0),
        ClickStreamSpec(events=300, users=1, categories=1, duration_ms=1),
    ],
)
def test_edge_specs_keep_the_invariants(spec: ClickStreamSpec) -> None:
    events = generate_clicks(spec)
    assert len(events) == spec.events
    assert all(spec.start_ms <= e.ts <= spec.start_ms + spec.duration_ms for e in events)
    assert len({(e.item_id, e.category_id) for e in events}) == len({e.item_id for e in events})
    debuts = item_debuts(spec)
    assert len(debuts) < spec.items  # at least one item exists at the start
    first = _first_seen(events)
    assert all(first[item] == ts for item, ts in debuts.items())


def test_two_hundred_thousand_events_generate() -> None:
    spec = ClickStreamSpec(users=5_000, items=50_000, events=200_000, seed=9)
    events = generate_clicks(spec)
    assert len(events) == 200_000
    assert len({e.event_id for e in events}) == 200_000
    assert events[0].ts <= events[len(events) // 2].ts <= events[-1].ts


def features_of(event: Event) -> object:
    """The event's declared features, as a dict."""
    return dict(event.features)


# --- a context feature with a known effect: the device -------------------------------------------


def test_no_device_by_default(events: list[Event]) -> None:
    assert all(fields == {} for _, fields in generate_rows(SPEC))
    assert [event for event, _ in generate_rows(SPEC)] == events


def test_the_device_changes_which_categories_are_clicked() -> None:
    rows = generate_rows(ClickStreamSpec(device_effect=0.5))
    assert [e.event_id for e, _ in rows] == [e.event_id for e in generate_clicks(SPEC)]
    devices = [str(fields["device"]) for _, fields in rows]
    assert set(devices) == set(DEVICES)
    # the effect: about two thirds of a device's events are in its categories (0.5 + 0.5 / 3)...
    hit = np.mean([device_of(e.category_id) == d for (e, _), d in zip(rows, devices, strict=True)])
    assert 0.62 < hit < 0.72
    # ...against a third with the same devices shuffled across events (no effect left)
    shuffled = np.random.default_rng(7).permutation(devices)
    baseline = np.mean([device_of(e.category_id) == d for (e, _), d in zip(rows, shuffled, strict=True)])
    assert 0.28 < baseline < 0.42
    # without the effect the same devices tell nothing about the categories
    plain = generate_clicks(SPEC)
    assert 0.28 < np.mean([device_of(e.category_id) == d for e, d in zip(plain, devices, strict=True)]) < 0.42


def test_devices_are_seeded_and_leave_the_other_draws_alone() -> None:
    spec = ClickStreamSpec(events=3_000, device_effect=0.3, seed=5)
    assert generate_rows(spec) == generate_rows(spec)
    with_devices = [e for e, _ in generate_rows(spec)]
    without = generate_clicks(ClickStreamSpec(events=3_000, seed=5))
    assert [(e.user_id, e.ts, e.action) for e in with_devices] == [
        (e.user_id, e.ts, e.action) for e in without
    ]


def test_the_schema_decides_whether_events_carry_the_device() -> None:
    spec = ClickStreamSpec(events=200, device_effect=0.5)
    assert generate_clicks(spec) == [e for e, _ in generate_rows(spec)]  # declared nothing: no device
    schema = FeatureSchema.of([FeatureSpec(name="device", role="context")])
    events = generate_clicks(spec, schema)
    assert [features_of(e) for e in events] == [f for _, f in generate_rows(spec)]


def test_a_bad_device_effect_is_refused() -> None:
    with pytest.raises(ConfigError, match="device_effect"):
        ClickStreamSpec(device_effect=1.5)


def test_generate_writes_the_device_as_a_top_level_field(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from streamrec.cli import app

    out = tmp_path / "clicks.jsonl"
    for effect in ("0", "0.5"):
        result = CliRunner().invoke(app, ["generate", str(out), "--events", "300", "--device-effect", effect])
        assert result.exit_code == 0, result.output
        lines = [orjson.loads(line) for line in out.read_bytes().splitlines()]
        devices = {line.get("device") for line in lines}
        assert devices == ({None} if effect == "0" else set(DEVICES))
    spec = ClickStreamSpec(events=300, device_effect=0.5)
    assert [line["event_id"] for line in lines] == [e.event_id for e, _ in generate_rows(spec)]
    assert [line["device"] for line in lines] == [f["device"] for _, f in generate_rows(spec)]


def test_an_unknown_synthetic_field_is_refused_without_listing_it_as_expected() -> None:
    # 'actions' is a field of the spec that a source string cannot set: not one to suggest
    with pytest.raises(DatasetError, match=r"unknown field 'actions'") as caught:
        synthetic_spec("synthetic:actions=pv")
    expected = str(caught.value).split("expected one of ", 1)[1]
    assert "actions" not in expected.split(", ") and "events" in expected.split(", ")


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--events", "0"], "--events must be a positive integer, got 0"),
        (["--users", "-3"], "--users must be a positive integer, got -3"),
        (["--seed", "-1"], "--seed must be a non-negative integer, got -1"),
        (["--device-effect", "2"], "--device-effect must be in [0, 1], got 2.0"),
        (["--items", "1", "--categories", "5"],
         "--items (1) must be at least --categories (5) so that every category has an item"),
    ],
)
def test_generate_names_the_flag_given_not_the_specs_field(
    args: list[str], line: str, tmp_path: Path
) -> None:
    """Found by a tour: `generate --events 0` said "ClickStreamSpec.events must be ...", a name
    the command's user never typed.
    """
    from typer.testing import CliRunner

    from streamrec.cli import app

    result = CliRunner().invoke(app, ["generate", str(tmp_path / "out.jsonl"), *args])
    assert result.exit_code == 1 and result.output == f"error: {line}\n", result.output


def test_a_synthetic_source_names_its_own_key_when_a_value_is_out_of_range() -> None:
    with pytest.raises(DatasetError) as caught:
        synthetic_spec("synthetic:events=0,users=2")
    assert str(caught.value) == "synthetic:events=0,users=2: events must be a positive integer, got 0"
