"""The declared feature schema: declarations, values and evolution."""

from __future__ import annotations

import pytest

from streamrec.config import load_config
from streamrec.errors import ConfigError, InvalidEvent, SchemaChange
from streamrec.features import FeatureSchema, FeatureSpec, read_features, read_value
from streamrec.features.schema import KIND_TYPES, kind_of
from streamrec.samples import Sample, parse_sample

GENRES = FeatureSpec(name="genres", kind="ids", max_ids=3)
YEAR = FeatureSpec(name="year", kind="number", transform="standardize", role="behaviour")
DEVICE = FeatureSpec(name="device", role="context", required=True)


def test_default_schema_is_item_and_category() -> None:
    schema = load_config().feature_schema()
    assert schema.names == ("item", "category")
    assert [f.source for f in schema.features] == ["item_id", "category_id"]
    assert schema.extras == ()


def test_declared_in_env_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    declared = '[{"name": "genres", "kind": "ids"}, {"name": "device", "role": "context"}]'
    monkeypatch.setenv("STREAMREC_FEATURES", declared)
    schema = load_config().feature_schema()
    assert schema.names == ("item", "category", "genres", "device")
    assert schema["device"].role == "context"


@pytest.mark.parametrize(
    ("declared", "says"),
    [
        ([{"name": "item"}], "share the name 'item'"),
        ([{"name": "user", "role": "user"}], "the user id's"),
        ([{"name": "shop", "field": "category_id"}], "read the event field 'category_id'"),
        ([{"name": "who", "field": "user_id"}], "user_id"),
        ([{"name": "tags", "kind": "ids", "transform": "log1p"}], "kind 'number' only"),
        ([{"name": "price", "kind": "number", "transform": "bucket", "boundaries": [3, 1]}], "increasing"),
        ([{"name": "Bad-Name"}], "STREAMREC_FEATURES"),
        ([{"name": "age", "role": "user", "outcome": True}], "only a behaviour feature can be an outcome"),
    ],
)
def test_bad_declarations_are_refused_naming_the_setting(declared: list[dict[str, str]], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        load_config(features=declared)


def test_values_are_checked_and_named() -> None:
    specs = [GENRES, YEAR, DEVICE]
    assert read_features({"genres": [1, "b"], "year": 1995, "device": "ios"}, specs) == {
        "genres": ("1", "b"),
        "year": 1995.0,
        "device": "ios",
    }
    assert read_features({"device": "ios", "genres": None}, specs) == {"device": "ios"}  # optional: absent
    cases: list[tuple[dict[str, object], str]] = [
        ({}, "feature 'device' is required"),
        ({"device": "ios", "genres": "a"}, "feature 'genres' .* must be a list"),
        ({"device": "ios", "genres": ["a"] * 4}, "4 ids, over its max_ids of 3"),
        ({"device": "ios", "year": "1995"}, "feature 'year' .* must be a number"),
        ({"device": "ios", "year": True}, "must be a number, got bool"),
        ({"device": "ios", "year": float("nan")}, "finite"),
        # finite in JSON, inf in the learner's float32 columns: one such event made its whole
        # micro-batch non-finite (skipped, with 39 good samples) before it was dead-lettered here
        ({"device": "ios", "year": 1e300}, r"feature 'year' .* within float32's range"),
        ({"device": "ios", "year": -3.5e38}, "within float32's range"),
        ({"device": "ios", "year": 10**400}, "within float32's range"),  # an int float() cannot hold
        ({"device": "x" * 129}, "feature 'device' .* 1..128 characters"),
        ({"device": "a\nb"}, "not printable"),
    ]
    for doc, says in cases:
        with pytest.raises(InvalidEvent, match=says):
            read_features(doc, specs)


def test_the_largest_float32_is_read() -> None:
    assert read_value(YEAR, 3.4e38) == 3.4e38


def test_every_value_read_is_of_its_kinds_types() -> None:
    """`KIND_TYPES`, which the learner's intake checks samples by, says what `read_value` gives."""
    raw: dict[str, list[object]] = {"id": ["a", 7], "ids": [["a", 1], [], ("b",)], "number": [1, 2.5, -0.5]}
    for spec in (GENRES, YEAR, DEVICE):
        for value in raw[spec.kind]:
            read = read_value(spec, value if spec.kind != "id" else str(value))
            assert type(read) in KIND_TYPES[spec.kind]
            assert kind_of(read) == spec.kind


def test_adding_a_feature_reads_old_records() -> None:
    old = FeatureSchema.of([GENRES])
    new = FeatureSchema.of([GENRES, YEAR])
    assert new.check_evolution(old, "snapshot v3") == ("year",)
    assert new.check_evolution(FeatureSchema.from_json(None), "snapshot v1") == ("genres", "year")


def test_removing_or_retyping_a_feature_is_refused_in_one_line() -> None:
    old = FeatureSchema.of([GENRES, YEAR])
    with pytest.raises(SchemaChange, match="feature 'year', which is no longer declared") as removed:
        FeatureSchema.of([GENRES]).check_evolution(old, "snapshot v3")
    retyped = FeatureSchema.of([GENRES, YEAR.model_copy(update={"transform": "log1p"})])
    with pytest.raises(SchemaChange, match=r"'year' declared otherwise \(transform changed\)") as changed:
        retyped.check_evolution(old, "snapshot v3")
    assert "\n" not in str(removed.value) + str(changed.value)


def test_recorded_form_round_trips_and_fingerprints() -> None:
    schema = FeatureSchema.of([GENRES, YEAR, DEVICE])
    assert FeatureSchema.from_json(schema.to_json()) == schema
    assert FeatureSchema.from_json(schema.to_json()).fingerprint == schema.fingerprint
    assert FeatureSchema.of([GENRES]).fingerprint != schema.fingerprint


def test_samples_carry_features_and_stay_unchanged_without_them() -> None:
    plain = Sample("e2", "u1", 1_700_000_060_000, "i2", "c1", 1, ("i1",), ("c1",))
    assert b"features" not in plain.to_json()
    rich = Sample(
        "e2", "u1", 1_700_000_060_000, "i2", "c1", 1, ("i1", "i0"), ("c1", "c0"),
        features={"genres": ("a", "b"), "year": 1995.0, "device": "ios"},
        seq_features={"genres": (("x",), None)},
    )
    assert parse_sample(rich.to_json()) == rich
    broken = rich.to_json().replace(b'[["x"],null]', b'[["x"]]')
    with pytest.raises(Exception, match="holds 1 values of 'genres' for 2 seq_items"):
        parse_sample(broken)
