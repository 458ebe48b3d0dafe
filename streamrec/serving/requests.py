"""A ``POST /score`` body read: the user, the candidates, the history and the context, checked.

The common form (string ids, candidates as ``"item"`` or ``"item:category"``, a history of
``[item, category]`` pairs) is decoded and checked in C by msgspec, its ids' characters
checked in one call, and its candidates kept as two columns (`Candidates`) that the scorer reads
whole: about a fifth of the general path's time on 100 candidates and 50 behaviours, where
every id was checked by a Python call. Every other form (integer ids, item objects with their
features, history objects) and every fault takes the general path, which reads each field in
turn and says which one is wrong; the fast path only declines, so a request reads the same
either way (tests/unit/serving/test_requests.py).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import msgspec
import orjson

from streamrec.errors import InvalidEvent
from streamrec.events import MAX_ID_LENGTH, as_id
from streamrec.jsonerrors import json_error
from streamrec.serving.features import Candidate, Candidates, GivenHistory


class BadRequest(ValueError):
    """A request the service cannot score; its message is the 400 response's reason."""



_Id = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_LENGTH)]


class _Plain(msgspec.Struct):
    """The common form of a request body; other keys (``request_id``) are ignored here."""

    user: _Id
    items: list[str]  # "item" or "item:category", split and checked after decoding
    history: list[tuple[_Id, _Id]] | None = None
    context: dict[str, Any] | None = None
    user_features: Any = None  # read, with its checks, by the general path


_PLAIN = msgspec.json.Decoder(_Plain)


def _plain_request(
    body: bytes, max_candidates: int
) -> tuple[str, Candidates, GivenHistory | None, dict[str, object]] | None:
    """The request read by the fast path; None when it is not of the common form, or breaks a rule."""
    try:
        plain = _PLAIN.decode(body)
    except msgspec.DecodeError:  # a validation error too: the general path names the fault
        return None
    except RecursionError:  # a value nested deeper than the stack: orjson's depth limit refuses it
        return None
    items, history = plain.items, plain.history
    if plain.user_features is not None:
        return None
    if not items or len(items) > max_candidates or max(map(len, items)) > MAX_ID_LENGTH:
        return None  # longer "item:category" strings may be right: the general path splits them
    parts = [item.partition(":") for item in items]
    item_ids = [part[0] for part in parts]
    ids = [plain.user, *items, *(i for pair in history or () for i in pair)]
    if "" in item_ids or not "".join(ids).isprintable():
        return None
    candidates = Candidates(item_ids, [part[2] or None for part in parts])
    given = None if history is None else GivenHistory(history, [{} for _ in history])
    return plain.user, candidates, given, plain.context or {}


class _Inexact(Exception):
    """An id orjson read as a float: an integer past 64 bits, or a real float."""


def parse_request(
    body: bytes, max_candidates: int
) -> tuple[str, Sequence[Candidate], GivenHistory | None]:
    """The user, candidates and optional history of a ``POST /score`` body (see `parse_score_request`).

    Raises:
        BadRequest: naming what is wrong.
    """
    user, candidates, history, _ = parse_score_request(body, max_candidates)
    return user, candidates, history


def parse_score_request(
    body: bytes, max_candidates: int
) -> tuple[str, Sequence[Candidate], GivenHistory | None, dict[str, object]]:
    """The user, candidates, optional history and context features of a ``POST /score`` body.

    Ids are typed as in the event contract: a string, or an integer carried as its decimal
    string (so ``5`` and ``"5"`` are one id), 1-128 printable characters. The common form
    is read by the fast path, the rest by the general one (see the module docstring).

    Raises:
        BadRequest: naming what is wrong.
    """
    plain = _plain_request(body, max_candidates)
    if plain is not None:
        return plain
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"not valid JSON: {json_error(exc)}") from exc
    try:
        parsed = _parsed(doc, max_candidates, exact=False)
    except _Inexact:
        # orjson reads integers beyond 64 bits as floats; the standard parser keeps them
        # exact (as the event parser does), and a real float is refused on this pass
        try:
            doc = json.loads(body)
        except RecursionError as exc:  # within orjson's depth limit (1,024), not the stack's
            raise BadRequest("not valid JSON: nested too deep") from exc
        parsed = _parsed(doc, max_candidates, exact=True)
    context = doc.get("context") or {}
    if not isinstance(context, dict):
        raise BadRequest("'context' must be an object of feature names and values")
    return (*parsed, context)


def _parsed(
    doc: object, max_candidates: int, exact: bool
) -> tuple[str, list[Candidate], GivenHistory | None]:
    if not isinstance(doc, dict):
        raise BadRequest("expected a JSON object with 'user' and 'items'")
    if doc.get("user") is None:
        raise BadRequest("field 'user' is missing: give the user's id, a string or integer")
    user, items = _id(doc["user"], "user", exact), doc.get("items")
    if not isinstance(items, list) or not items:
        raise BadRequest("'items' must be a non-empty list")
    if len(items) > max_candidates:
        raise BadRequest(
            f"{len(items)} items; at most {max_candidates} per request (STREAMREC_SERVING__MAX_CANDIDATES)"
        )
    candidates = [_candidate(item, exact) for item in items]
    history, user_features = doc.get("history"), doc.get("user_features")
    if history is None:
        if user_features is not None:
            raise BadRequest(
                "'user_features' come with the request's own 'history' ([] for a user with none): "
                "without one the stores are read, the profile store for the user's features"
            )
        return user, candidates, None
    if not isinstance(history, list):
        raise BadRequest(_HISTORY)
    if not isinstance(user_features, dict | None):
        raise BadRequest("'user_features' must be an object of the user's declared features and values")
    behaviours = [_behaviour(entry, exact) for entry in history]
    pairs, given = [b[0] for b in behaviours], [b[1] for b in behaviours]
    return user, candidates, GivenHistory(pairs, given, user_features)


def _id(value: object, name: str, exact: bool) -> str:
    if isinstance(value, float) and not exact:
        raise _Inexact
    try:
        return as_id(value, name)
    except InvalidEvent as exc:
        raise BadRequest(str(exc)) from exc


_ITEM_KEYS = ("item", "item_id")
_CATEGORY_KEYS = ("category", "category_id")
_HISTORY = (
    "'history' must be a list, oldest first, of [item, category] pairs or objects {'item_id': ..., "
    "'category_id': ..., <declared behaviour feature>: ...}"
)


def _behaviour(entry: object, exact: bool) -> tuple[tuple[str, str], dict[str, object]]:
    """A history entry's (item, category) and its raw behaviour features (none in the pair form)."""
    if isinstance(entry, list) and len(entry) == 2:
        return (_id(entry[0], "history", exact), _id(entry[1], "history", exact)), {}
    if isinstance(entry, dict):
        place = "a history entry"
        item, category = _first(entry, _ITEM_KEYS, place), _first(entry, _CATEGORY_KEYS, place)
        if item is not None and category is not None:
            return (_id(item, "history", exact), _id(category, "history", exact)), _features_of(entry)
    raise BadRequest(f"{_HISTORY}: {entry!r}")


def _first(entry: dict[str, object], keys: tuple[str, ...], place: str) -> object:
    """The value of the first of ``keys`` that ``entry`` holds, not null (None when none).

    Raises:
        BadRequest: ``entry`` gives both spellings, with different values.
    """
    given = [(k, entry[k]) for k in keys if entry.get(k) is not None]
    if len(given) > 1 and given[0][1] != given[1][1]:
        (one, _), (other, _) = given
        raise BadRequest(f"{place} gives both {one!r} and {other!r}: give one of them: {entry!r}")
    return given[0][1] if given else None


def _features_of(entry: dict[str, object]) -> dict[str, object]:
    """An item object's raw feature values: every key but its item's and category's."""
    return {k: v for k, v in entry.items() if k not in _ITEM_KEYS + _CATEGORY_KEYS}


def _candidate(item: object, exact: bool) -> Candidate:
    if isinstance(item, str) and item:
        candidate = Candidate.parse(item)
        _id(candidate.item_id, "item", exact)
        if candidate.category_id is not None:
            _id(candidate.category_id, "category", exact)
        return candidate
    if isinstance(item, int | float) and not isinstance(item, bool):
        return Candidate(_id(item, "item", exact))
    if isinstance(item, dict):
        item_key = next((k for k in _ITEM_KEYS if k in item), None)
        if item_key is not None:
            _first(item, _ITEM_KEYS, "an item")  # not both, unless the same
            category = _first(item, _CATEGORY_KEYS, "an item")
            category_id = None if category is None else _id(category, "category", exact)
            return Candidate(_id(item[item_key], "item", exact), category_id, _features_of(item))
    raise BadRequest(
        "an item is a non-empty string, an integer or an object {'item_id': ..., 'category_id': ..., "
        f"<declared behaviour feature>: ...}}: {item!r}"
    )


REQUEST_ID_HEADER = "x-request-id"


def request_id_of(headers: Mapping[str, str], body: bytes) -> str:
    """The request's id: its ``X-Request-Id`` header, its body's ``request_id``, or a new one.

    Returned in the response, so a client can log it with the arm and send it back with the
    click events of the list it was shown.

    Raises:
        BadRequest: a given id is not an id (1-128 printable characters).
    """
    given: object = headers.get(REQUEST_ID_HEADER)
    if given is None and b'"request_id"' in body:  # parsed again only when it is there
        doc = orjson.loads(body)
        given = doc.get("request_id") if isinstance(doc, dict) else None
    if given is None:
        return uuid.uuid4().hex
    try:
        return as_id(given, "request_id")
    except InvalidEvent as exc:
        raise BadRequest(str(exc)) from exc
