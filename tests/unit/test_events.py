"""The event contract: valid events round-trip, every kind of bad input has a reason."""

from __future__ import annotations

import zlib

import orjson
import pytest

from streamrec.errors import InvalidEvent
from streamrec.events import _DECODER, MAX_TS_MS, MIN_TS_MS, Event, _checked, parse_event
from streamrec.features.schema import FeatureSchema, FeatureSpec
from tests.support import decoder_agreement

NOW = 1_700_000_000_000


def parse(raw: bytes) -> Event:
    return parse_event(raw, now_ms=NOW, max_future_ms=300_000, max_bytes=1024)


def doc(**over: object) -> bytes:
    base: dict[str, object] = {
        "event_id": "e1", "user_id": 7, "item_id": "i9", "category_id": 3, "action": "pv",
        "ts": NOW - 1000,
    }
    base.update(over)
    return orjson.dumps({k: v for k, v in base.items() if v is not ...})


def test_valid_event_round_trips_with_ids_as_strings() -> None:
    event = parse(doc(label=1))
    assert event == Event("e1", "7", "i9", "3", "pv", NOW - 1000, 1)
    assert parse(event.to_json()) == event


def test_unknown_fields_are_ignored() -> None:
    assert parse(doc(extra={"page": "home"})).event_id == "e1"


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (doc(user_id=...), "missing field(s): user_id"),
        (doc(item_id=1.5), "'item_id' must be a string or integer"),
        (doc(item_id=True), "'item_id' must be a string or integer"),
        (doc(user_id=""), "1..128 characters"),
        (doc(user_id="a\tb"), "not printable"),
        (doc(ts="yesterday"), "integer epoch milliseconds"),
        (doc(ts=1_511_658_000), "looks like seconds"),
        (doc(ts=NOW + 3_600_000), "in the future"),
        (doc(label=4), "'label' must be 0 or 1"),
        (doc(action=1), "'action' must be a string (the contract's), got int"),
        (doc(action=True), "'action' must be a string (the contract's), got bool"),
        (b"{" + b" " * 2000 + b"}", "over the 1024-byte limit"),
    ],
)
def test_invalid_events_raise_with_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(InvalidEvent, match=None) as info:
        parse(raw)
    assert reason in str(info.value)


def test_null_record_is_invalid() -> None:
    with pytest.raises(InvalidEvent, match="null"):
        parse_event(None, now_ms=NOW, max_future_ms=0, max_bytes=10)


def test_integer_ids_of_any_size_are_kept_exactly() -> None:
    """The orjson parser reads integers beyond 64 bits as floats: 2**70 was once dead-lettered as a float."""
    raw = b'{"event_id": 1, "user_id": 1180591620717411303424, "item_id": 18446744073709551615,' \
        b' "category_id": -5, "action": "pv", "ts": %d}' % NOW
    event = parse_event(raw, now_ms=NOW, max_future_ms=0, max_bytes=1000)
    assert (event.user_id, event.item_id, event.category_id) == (str(2**70), str(2**64 - 1), "-5")


def test_a_real_float_id_is_still_refused_with_an_accurate_reason() -> None:
    for value in (b"1.5", b"1e21"):
        raw = b'{"event_id": "e", "user_id": %s, "item_id": "i", "category_id": "c", "action": "pv",' \
            b' "ts": %d}' % (value, NOW)
        with pytest.raises(InvalidEvent, match="'user_id' must be a string or integer, got float"):
            parse_event(raw, now_ms=NOW, max_future_ms=0, max_bytes=1000)


def text_doc(**over: object) -> bytes:
    """A document of string ids only: the one combined check of the common case reads it."""
    return doc(**{"user_id": "7", "category_id": "3", **over})


@pytest.mark.parametrize(
    ("over", "reason"),
    [
        ({"user_id": ""}, "1..128 characters"),
        ({"item_id": "x" * 129}, "1..128 characters"),
        ({"action": "p\nv"}, "not printable"),
        ({"ts": 1_511_658_000}, "looks like seconds"),
        ({"ts": NOW + 3_600_000}, "in the future"),
        ({"ts": True}, "integer epoch milliseconds"),
        ({"label": 4}, "'label' must be 0 or 1"),
        ({"event_id": ...}, "missing field(s): event_id"),
    ],
)
def test_the_common_case_check_lets_no_fault_through(over: dict[str, object], reason: str) -> None:
    with pytest.raises(InvalidEvent) as info:
        parse(text_doc(**over))
    assert reason in str(info.value)


def test_the_common_case_and_the_field_checks_agree_on_valid_events() -> None:
    assert parse(text_doc(label=0)) == Event("e1", "7", "i9", "3", "pv", NOW - 1000, 0)
    assert parse(text_doc(label=True)).label == 1  # booleans are read by the field checks
    assert parse(text_doc(ts=float(NOW))).ts == NOW
    assert parse(text_doc(ts=NOW + 300_000)).ts == NOW + 300_000  # the future limit is inclusive


_ODD = [
    "", "x" * 128, "x" * 129, "a\tb", "é", "\u2028", "\ud800", "1", 0, -1, 7, 2**70, 1.5, True, False,
    None, [], {}, NOW, MIN_TS_MS - 1, MIN_TS_MS, NOW + 300_000, NOW + 300_001, float(NOW), 1.0, ...,
]


def test_the_decoder_accepts_nothing_the_field_checks_refuse() -> None:
    """The C decoder's common case and the field-by-field checks agree on every record: each
    field replaced by odd values, one at a time and in random pairs.
    """
    base = {"event_id": "e1", "user_id": "7", "item_id": "i9", "category_id": "3", "action": "pv",
            "ts": NOW - 1000, "label": ...}
    fast = decoder_agreement(base, _ODD, parse, lambda r: _checked(r, NOW, 300_000), _DECODER, InvalidEvent)
    assert fast > 25  # the decoder took the common case itself


@pytest.mark.parametrize("scale", [1_000, 1_000_000])
def test_micro_and_nanoseconds_are_refused_where_no_clock_bounds_them(scale: int) -> None:
    """Found by a tour: the replay reader has no clock (``now_ms`` 2**62), so a file stamped in
    microseconds replayed as the year 55,000 and crashed the report's plot after the run.
    """
    raw = text_doc(ts=NOW * scale)
    with pytest.raises(InvalidEvent, match="after the year 9999"):
        parse_event(raw, now_ms=2**62, max_future_ms=0, max_bytes=4096)
    last = text_doc(ts=MAX_TS_MS)
    assert parse_event(last, now_ms=2**62, max_future_ms=0, max_bytes=4096).ts == MAX_TS_MS


def test_a_repeated_key_counts_once_as_the_last_value_in_both_checks() -> None:
    raw = text_doc()[:-1] + b',"ts":%d}' % (NOW + 1)
    assert parse(raw).ts == _checked(raw, NOW, 300_000).ts == NOW + 1


@pytest.mark.parametrize("event", [
    Event("e1", "u1", "i1", "c1", "pv", MIN_TS_MS),
    Event("e1", "it's", 'say "hi"', "back\\slash", "naïve ü 中", 2 * MIN_TS_MS, 1),
    Event("e1", "u'\"", "\u2028", "c", "buy", MIN_TS_MS + 1, 0),
])
def test_the_fingerprint_is_the_crc_of_the_content_tuple_as_stored_marks_have_it(event: Event) -> None:
    """Ids already in Redis carry fingerprints made as ``crc32(repr(tuple))``: a different
    digest after an upgrade would turn a resend into a conflict and a redo into its own.
    """
    fields = (event.user_id, event.item_id, event.category_id, event.action, event.ts, event.label)
    assert event.fingerprint() == f"{zlib.crc32(repr(fields).encode()):08x}"


def test_the_fingerprint_of_one_event_is_pinned() -> None:
    assert Event("e1", "u1", "i1", "c1", "pv", 1_511_658_000_000).fingerprint() == "b7a93d44"


# Declared features (streamrec.features): top-level fields, read only when declared.
GENRES = FeatureSpec(name="genres", kind="ids", max_ids=2)
PRICE = FeatureSpec(name="price", field="price_cents", kind="number", required=True)
DEVICE = FeatureSpec(name="device", role="context")
SCHEMA = FeatureSchema.of([GENRES, PRICE, DEVICE])


def parse_with(raw: bytes, schema: FeatureSchema = SCHEMA) -> Event:
    return parse_event(raw, now_ms=NOW, max_future_ms=300_000, max_bytes=1024, extras=schema.extras)


def test_declared_features_are_read_from_top_level_fields_by_name() -> None:
    event = parse_with(doc(genres=["a", 7], price_cents=250, device="ios"))
    assert event.features == {"genres": ("a", "7"), "price": 250.0, "device": "ios"}
    checked = parse_with(doc(ts=float(NOW - 1000), price_cents=1))  # the field-by-field path too
    assert checked.features == {"price": 1.0}


def test_declared_features_round_trip_through_the_wire_form() -> None:
    event = parse_with(doc(genres=["a"], price_cents=2.5, label=1))
    assert orjson.loads(event.to_json(SCHEMA))["price_cents"] == 2.5
    assert parse_with(event.to_json(SCHEMA)) == event


@pytest.mark.parametrize(
    ("over", "reason"),
    [
        ({}, "feature 'price' is required: field 'price_cents' is missing"),
        ({"price_cents": "cheap"}, "feature 'price' (field 'price_cents') must be a number"),
        ({"price_cents": 1, "genres": ["a", "b", "c"]}, "feature 'genres' (field 'genres') has 3 ids"),
        ({"price_cents": 1, "device": ["ios"]}, "feature 'device' (field 'device') must hold string"),
    ],
)
def test_a_value_breaking_its_declaration_is_refused_naming_the_feature(
    over: dict[str, object], reason: str
) -> None:
    with pytest.raises(InvalidEvent) as info:
        parse_with(doc(**over))
    assert str(info.value).startswith(reason)


def test_the_default_schema_ignores_feature_fields_and_keeps_its_fingerprint() -> None:
    raw = doc(genres=["a"], features={"genres": "x"})
    event = parse(raw)
    assert not event.features and event == parse(doc())
    assert event.to_json() == Event("e1", "7", "i9", "3", "pv", NOW - 1000).to_json()
    text = f"('7', 'i9', '3', 'pv', {NOW - 1000}, None)"  # the fingerprint stored marks depend on
    assert event.fingerprint() == zlib.crc32(text.encode()).to_bytes(4).hex()


def test_declared_features_replace_whatever_the_wire_name_held() -> None:
    raw = doc(price_cents=1, **{"\u00a7features": {"genres": "x"}})
    assert parse_with(raw).features == {"price": 1.0}


def test_features_count_in_the_fingerprint_only_when_present() -> None:
    plain = parse_with(doc(price_cents=1), FeatureSchema.default())
    priced = parse_with(doc(price_cents=1))
    assert priced.fingerprint() != plain.fingerprint() != parse_with(doc(price_cents=2)).fingerprint()
    assert hash(priced) == hash(plain)  # equal contract fields: a mapping is not hashed


@pytest.mark.parametrize(("depth", "event_id"), [(1_100, b'"e"'), (5_000, b'"e"'), (1_000, b"1e30")])
def test_json_nested_past_the_parsers_depth_is_a_dead_letter_not_a_crash(depth: int, event_id: bytes) -> None:
    """Found by the consumers tour: a 10 KB event (under the 16 KiB limit) with an unknown field of
    5,000 nested arrays raised ``RecursionError`` out of the decoder, past the dead-letter path:
    the consumer stopped at that record at every start, a poison pill. A float id read again by
    the standard parser (for exact big integers) met its lower limit at 1,000.
    """
    fields = b'"user_id":"u","item_id":"i","category_id":"c","action":"pv","ts":%d' % MIN_TS_MS
    raw = b'{"event_id":%s,%s,"x":%s%s}' % (event_id, fields, b"[" * depth, b"]" * depth)
    with pytest.raises(InvalidEvent, match="not valid JSON: .*depth"):
        parse_event(raw, now_ms=MIN_TS_MS, max_future_ms=0, max_bytes=1 << 20)


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_a_nan_or_infinity_token_is_refused_naming_its_field(token: str) -> None:
    # Found by a tour of docs/your-features.md: Python's json.dumps writes float("nan") as NaN,
    # which JSON does not have; the dead letter said only "unexpected character ... column 167".
    raw = ('{"event_id": "e1", "user_id": "u1", "item_id": "i1", "category_id": "c1", "action": "click", '
           f'"ts": {NOW}, "dwell_s": {token}, "genres": ["a"]}}').encode()
    spec = FeatureSpec(name="dwell_s", kind="number")
    with pytest.raises(InvalidEvent, match=(
        rf"^not valid JSON: field 'dwell_s' holds {token}, which JSON does not have \(send null for none; "
        r"json.dumps\(allow_nan=False\) finds them\): line 1 column \d+"
    )):
        parse_event(raw, now_ms=NOW, max_future_ms=0, max_bytes=1000, extras=[spec])


def test_declared_features_nested_in_a_features_object_are_refused_naming_them() -> None:
    # Found by a tour of docs/your-features.md: a bare producer that wrote an event as
    # {..., "features": {"dwell_s": 3.0, "genres": ["a"]}} (as Event(features=...) reads) had
    # them ignored: its sample read every one's default, and nothing said so.
    head = ('{"event_id": "e1", "user_id": "u1", "item_id": "i1", "category_id": "c1", "action": "click", '
            f'"ts": {NOW}')
    specs = [FeatureSpec(name="dwell_s", kind="number"), FeatureSpec(name="genres", kind="ids")]
    nested = (head + ', "features": {"dwell_s": 3.0, "genres": ["a"], "colour": "red"}}').encode()
    with pytest.raises(InvalidEvent, match=(
        r"^feature 'dwell_s' \(field 'dwell_s'\) is inside the field 'features' \(and 'genres'\): "
        r"declared features are top-level fields of the event"
    )):
        parse_event(nested, now_ms=NOW, max_future_ms=0, max_bytes=1000, extras=specs)
    # a field 'features' of the application's own, or one beside the top-level values, is ignored
    tails = (', "features": {"colour": "red"}}', ', "features": ["x"]}',
             ', "dwell_s": 2, "features": {"dwell_s": 1}}')
    for tail in tails:
        event = parse_event((head + tail).encode(), now_ms=NOW, max_future_ms=0, max_bytes=1000, extras=specs)
        assert event.features.get("dwell_s") in (None, 2.0)
