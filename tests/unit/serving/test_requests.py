"""A score request's body read by the fast path (string ids, pairs: decoded and checked in C) and
by the general one alike: the same user, candidates, history and context, and the same 400s.
"""

from __future__ import annotations

import orjson
import pytest

from streamrec.serving.features import Candidate, Candidates, GivenHistory
from streamrec.serving.requests import BadRequest, parse_score_request


def _read(doc: object, max_candidates: int = 10) -> tuple[object, ...]:
    user, candidates, history, context = parse_score_request(orjson.dumps(doc), max_candidates)
    given = None if history is None else (list(history), [dict(g) for g in history.given])
    return user, [(c.item_id, c.category_id, dict(c.features)) for c in candidates], given, context


@pytest.mark.parametrize(
    "doc",
    [
        {"user": "u1", "items": ["i1", "i2:c2", "i3:"]},
        {"user": "u1", "items": ["i1:c1", "i2:c:2"], "history": [["i9", "c7"], ["i8", "c8"]]},
        {"user": "u1", "items": ["i1"], "history": [], "context": {"device": "ios"}},
        {"user": "u1", "items": ["i1"], "history": None, "context": None, "request_id": "r1", "other": 1},
        {"user": "ü" * 128, "items": ["é" * 63 + ":" + "c" * 64], "history": [["h" * 128, "c"]]},
    ],
)
def test_the_fast_path_reads_what_the_general_one_reads(doc: dict[str, object]) -> None:
    assert isinstance(parse_score_request(orjson.dumps(doc), 10)[1], Candidates)  # the fast path took it
    fast = _read(doc)
    # the same request in forms only the general path reads: an item object, an integer id
    items = doc["items"]
    assert isinstance(items, list)
    general = _read({**doc, "items": [*items, {"item_id": 5}]})
    assert general[0] == fast[0] and general[2:] == fast[2:]
    assert general[1] == [*fast[1], ("5", None, {})]  # type: ignore[misc]


def test_the_fast_path_gives_columns_the_scorer_reads_whole() -> None:
    user, candidates, history, context = parse_score_request(
        b'{"user": "u1", "items": ["i1:c1", "i2"], "history": [["i9", "c7"]]}', 10
    )
    assert isinstance(candidates, Candidates)
    assert candidates.item_ids == ["i1", "i2"] and candidates.category_ids == ["c1", None]
    assert list(candidates) == [Candidate("i1", "c1"), Candidate("i2")] and len(candidates) == 2
    assert candidates[-1] == Candidate("i2") and candidates[:1] == [Candidate("i1", "c1")]
    assert isinstance(history, GivenHistory) and history == [("i9", "c7")] and history.given == ({},)
    assert (user, context) == ("u1", {})


def test_an_item_and_category_of_128_characters_each_are_read_by_the_general_path() -> None:
    body = orjson.dumps({"user": "u", "items": ["é" * 128 + ":" + "c" * 128]})
    _, candidates, _, _ = parse_score_request(body, 10)
    assert list(candidates) == [Candidate("é" * 128, "c" * 128)]


@pytest.mark.parametrize(
    ("doc", "reason"),
    [
        ({"user": "u", "items": ["a\u0001"]}, "'item' contains U+"),
        ({"user": "u", "items": ["a:\u0001"]}, "'category' contains U+"),
        ({"user": "u\n", "items": ["a"]}, "'user' contains U+"),
        ({"user": "u", "items": ["a"], "history": [["h", "\t"]]}, "'history' contains U+"),
        ({"user": "u", "items": [":c"]}, "'item' must have 1..128"),
        ({"user": "u", "items": [""]}, "an item is a non-empty string"),
        ({"user": "", "items": ["a"]}, "'user' must have 1..128"),
        ({"user": "u", "items": ["x" * 129]}, "'item' must have 1..128"),
        ({"user": "u", "items": ["a:" + "x" * 129]}, "'category' must have 1..128"),
        ({"user": "u", "items": ["a"], "history": [["h", "x" * 129]]}, "'history' must have 1..128"),
        ({"user": "u", "items": ["a"], "history": [["h", "c", "x"]]}, "'history' must be"),
        ({"user": "u", "items": []}, "'items' must be a non-empty list"),
        ({"user": "u", "items": ["a"] * 11}, "11 items; at most 10"),
        ({"user": "u", "items": ["a"], "context": ["device"]}, "'context' must be an object"),
        # found by a tour: both said "field 'user' must be a string or integer, got NoneType"
        ({"items": ["a"]}, "field 'user' is missing: give the user's id, a string or integer"),
        ({"user": None, "items": ["a"]}, "field 'user' is missing: give the user's id, a string or integer"),
    ],
)
def test_a_bad_plain_request_gets_the_general_path_s_reason(doc: dict[str, object], reason: str) -> None:
    with pytest.raises(BadRequest, match=reason):
        parse_score_request(orjson.dumps(doc), 10)


@pytest.mark.parametrize("key", ["context", "other"])
def test_a_value_nested_past_the_parsers_depth_is_a_bad_request(key: str) -> None:
    # found by a tour: a context (or any other key) nested 2,000 deep raised RecursionError in
    # the fast path's decoder, and the server answered 503 "cannot score now" and logged an ERROR
    value = "[" * 2000 + "]" * 2000
    body = f'{{"user": "u", "items": ["a"], "{key}": {{"x": {value}}}}}'.encode()
    with pytest.raises(BadRequest, match="not valid JSON: .*depth"):
        parse_score_request(body, 10)


def test_a_value_nested_within_orjson_s_depth_past_the_stack_s_is_a_bad_request() -> None:
    # an integer id past 64 bits sends the body to the standard parser, which recurses
    value = "[" * 1020 + "]" * 1020
    body = f'{{"user": 18446744073709551616, "items": ["a"], "context": {{"x": {value}}}}}'.encode()
    with pytest.raises(BadRequest, match="not valid JSON: nested too deep"):
        parse_score_request(body, 10)


@pytest.mark.parametrize(
    ("entry", "place"),
    [
        ({"items": [{"item": "i1", "item_id": "i2"}]}, "an item"),
        ({"items": [{"item_id": "i1", "category": "c1", "category_id": "c2"}]}, "an item"),
        ({"items": ["i1"], "history": [{"item": "i8", "item_id": "i9", "category_id": "c1"}]},
         "a history entry"),
    ],
    ids=str,
)
def test_an_object_giving_both_spellings_of_its_item_or_category_is_refused(
    entry: dict[str, object], place: str
) -> None:
    """Found by a tour: ``{"item": "i1", "item_id": "i2"}`` was scored as one of them, silently."""
    with pytest.raises(BadRequest, match=f"{place} gives both"):
        parse_score_request(orjson.dumps({"user": "u1", **entry}), 10)


def test_user_features_come_with_the_request_s_own_history_and_are_checked_there() -> None:
    doc = {"user": "u1", "items": ["i1"], "history": [["i9", "c7"]], "user_features": {"tier": "gold"}}
    history = parse_score_request(orjson.dumps(doc), 10)[2]
    assert isinstance(history, GivenHistory) and dict(history.user_features) == {"tier": "gold"}
    new = parse_score_request(orjson.dumps({**doc, "history": []}), 10)[2]  # a new user, known to the app
    assert new == [] and isinstance(new, GivenHistory) and dict(new.user_features) == {"tier": "gold"}
    plain = parse_score_request(orjson.dumps({**doc, "user_features": None}), 10)[2]
    assert plain is not None and dict(plain.user_features) == {}
    with pytest.raises(BadRequest, match="'user_features' must be an object"):
        parse_score_request(orjson.dumps({**doc, "user_features": ["gold"]}), 10)
    # without a history of its own the stores are read, the profile store for the user's features:
    # a request's would be dropped, so it is refused rather than ignored
    with pytest.raises(BadRequest, match="'user_features' come with the request's own 'history'"):
        parse_score_request(orjson.dumps({k: v for k, v in doc.items() if k != "history"}), 10)


def test_a_nan_in_a_request_is_a_bad_request_naming_its_field() -> None:
    # found by a tour of docs/your-features.md: a context {"hour": NaN} (Python's json.dumps of a
    # float nan) got 400 "unexpected character ... column 87", naming no field
    body = b'{"user": "u1", "items": [{"item_id": "i7", "category_id": "c2"}], "context": {"hour": NaN}}'
    with pytest.raises(BadRequest, match=r"not valid JSON: field 'hour' holds NaN, which JSON does not have"):
        parse_score_request(body, 10)
    body = b'{"user": "u1", "items": ["a"], "history": [{"item_id": "i3", "rating": [1, -Infinity]}]}'
    with pytest.raises(BadRequest, match=r"not valid JSON: a value is -Infinity, which JSON does not have"):
        parse_score_request(body, 10)
