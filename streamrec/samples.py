"""The training-sample contract on topic ``streamrec.samples`` (key = ``user_id``).

A sample pairs a target item with the user's behaviour sequence *as it was before* the event
(only behaviours with an earlier event time), so training never sees the future.

Wire form: a JSON object::

    {"sample_id": "e-1~n0", "user_id": "42", "ts": 1511658000000, "item_id": "1001",
     "category_id": "7", "label": 0, "seq_items": ["998", "1000"], "seq_categories": ["7", "3"]}

Decoding is strict, because one malformed sample used to end the learner on every restart
and a ``label: null`` turned every weight to NaN: ids are non-empty strings (the consumers
write them so, even for integer event ids), ``ts`` is an integer of epoch milliseconds,
``label`` is exactly the integer 0 or 1 (``true``/``false`` are refused: `Sample.to_json`
never writes them, so a boolean means another writer), and the two sequences are lists of
non-empty strings of one length. Unknown fields are ignored, so a newer consumer can add
context without breaking an older learner.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import msgspec
import orjson

from streamrec.errors import InvalidSample
from streamrec.events import MAX_TS_MS, MIN_TS_MS
from streamrec.jsonerrors import json_error

# A declared feature's value on the wire (streamrec.features.Value): an id, ids or a number.
FeatureValue = str | tuple[str, ...] | float

_IDS = ("sample_id", "user_id", "item_id", "category_id")
_SEQUENCES = ("seq_items", "seq_categories")
_FIELDS = (*_IDS, "ts", "label", *_SEQUENCES)
#: The default schema's features (`streamrec.features.BUILTIN`) as a sample carries them, in
#: the contract's own fields: feature name -> (the target's field, the sequence's field).
BUILTIN_FIELDS: dict[str, tuple[str, str]] = {
    "item": ("item_id", "seq_items"),
    "category": ("category_id", "seq_categories"),
}
# A reason quotes a bad value; this keeps a huge one (a 1 MB string) out of logs and headers.
_SHOW = reprlib.Repr()
_SHOW.maxstring = _SHOW.maxother = 40
_SHOW.maxlist = 4

__all__ = [
    "BUILTIN_FIELDS", "MAX_TS_MS", "MIN_TS_MS", "Sample", "builtin_columns", "encode_sample", "parse_sample",
]


_Id = Annotated[str, msgspec.Meta(min_length=1)]


class Sample(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    """One labelled (user, target item) pair with the point-in-time behaviour sequence.

    ``seq_items``/``seq_categories`` are oldest first, all strictly earlier than ``ts``.
    ``sample_id`` is the event id for a positive or explicit sample and ``<event_id>~n<k>``
    for the k-th sampled negative, so a redelivered event yields the same ids.

    A frozen msgspec struct, as `Event`: the consumers make two for
    every click and the learner decodes 10^5 a micro-batch. The annotations' limits are the
    contract's, checked when a sample is decoded (`parse_sample`), not when one is made.
    Untracked by the garbage collector, as an event (strings, numbers and tuples of strings
    cannot form a reference cycle).

    Examples:
        >>> sample = Sample("e2", "u1", 1_700_000_060_000, "i2", "c1", 1, ("i1",), ("c1",))
        >>> sample.to_json()
        b'{"sample_id":"e2","user_id":"u1",...,"label":1,"seq_items":["i1"],"seq_categories":["c1"]}'
        >>> Sample.from_json(sample.to_json()) == sample
        True
    """

    sample_id: _Id
    user_id: _Id
    ts: Annotated[int, msgspec.Meta(ge=MIN_TS_MS, le=MAX_TS_MS)]
    item_id: _Id
    category_id: _Id
    label: Annotated[int, msgspec.Meta(ge=0, le=1)]
    seq_items: tuple[_Id, ...]
    seq_categories: tuple[_Id, ...]
    # The declared features beyond item and category (streamrec.features), by name: the
    # target's behaviour features, the user's as of ``ts`` and the moment's context. A feature
    # absent here reads its default. Omitted from the wire when empty, so the default schema's
    # samples are as before.
    features: dict[str, FeatureValue] = msgspec.field(default_factory=dict)
    # Each declared behaviour feature along the sequence, aligned with ``seq_items``; a
    # behaviour stored before the feature was declared holds null there (its default).
    seq_features: dict[str, tuple[FeatureValue | None, ...]] = msgspec.field(default_factory=dict)

    def to_json(self) -> bytes:
        """Encode in the wire form."""
        return _ENCODER.encode(self)

    @classmethod
    def from_json(cls, raw: bytes | None) -> Sample:
        """Decode and validate the wire form: `parse_sample`.

        Raises:
            InvalidSample: The record breaks the contract; the message says how.
        """
        return parse_sample(raw)


def builtin_columns(samples: Sequence[Sample]) -> dict[str, tuple[list[str], list[tuple[str, ...]]]]:
    """The default schema's features of ``samples`` (`BUILTIN_FIELDS`), by name.

    Per feature: the targets' ids and each sample's sequence. Attribute reads in list
    comprehensions, twice as fast as ``attrgetter`` by name: the learner reads 10^5 samples a
    micro-batch.
    """
    return {
        "item": ([s.item_id for s in samples], [s.seq_items for s in samples]),
        "category": ([s.category_id for s in samples], [s.seq_categories for s in samples]),
    }


def parse_sample(raw: bytes | None) -> Sample:
    """Decode and validate one samples-topic record value (``None``: a null value).

    The learner decodes about 10^5 of these per micro-batch, so a valid sample is decoded and
    checked in C by msgspec (the limits on `Sample`'s fields); only a refused one is
    examined field by field for its reason.

    Raises:
        InvalidSample: The record breaks the contract; the message says how.

    Examples:
        >>> raw = b'{"sample_id":"e2","user_id":"u1","ts":1700000060000,"item_id":"i2",'
        >>> raw += b'"category_id":"c1","label":2,"seq_items":[],"seq_categories":[]}'
        >>> parse_sample(raw)
        Traceback (most recent call last):
        ...
        streamrec.errors.InvalidSample: field 'label' must be 0 or 1 (an integer), got 2 (int)
    """
    if raw is not None:
        try:
            sample = _DECODER.decode(raw)  # the contract in C: a valid sample passes at once
        except (msgspec.MsgspecError, RecursionError):  # nested too deep: `_object` says so
            pass
        else:
            n = len(sample.seq_items)
            if len(sample.seq_categories) == n and (
                not sample.seq_features or all(len(v) == n for v in sample.seq_features.values())
            ):
                return sample
            if len(sample.seq_categories) == n:
                name = next(k for k, v in sample.seq_features.items() if len(v) != n)
                raise InvalidSample(
                    f"field 'seq_features' holds {len(sample.seq_features[name])} values of {name!r} "
                    f"for {n} seq_items"
                )
    return _checked(raw)


def _checked(raw: bytes | None) -> Sample:
    """Check a record field by field.

    The reason a record is not a valid sample (or the sample, should the decoder have refused a
    valid one).
    """
    doc = _object(raw)
    try:
        sample_id, user_id, item_id, category_id = (
            doc["sample_id"], doc["user_id"], doc["item_id"], doc["category_id"]
        )
        ts, label, items, categories = doc["ts"], doc["label"], doc["seq_items"], doc["seq_categories"]
    except KeyError:
        missing = [name for name in _FIELDS if name not in doc]
        raise InvalidSample(f"missing field(s): {', '.join(missing)}") from None
    if not (
        _is_id(sample_id) and _is_id(user_id) and _is_id(item_id) and _is_id(category_id)
        and type(ts) is int and MIN_TS_MS <= ts <= MAX_TS_MS
        and type(label) is int and (label == 0 or label == 1)
        and _is_id_list(items) and _is_id_list(categories) and len(items) == len(categories)
    ):
        raise InvalidSample(_reason(doc))
    return Sample(
        sample_id, user_id, ts, item_id, category_id, label, tuple(items), tuple(categories)
    )


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(Sample)
#: `Sample.to_json` as a plain C callable: the consumers encode about two samples an
#: event, each without the method's Python frame.
encode_sample: Callable[[Sample], bytes] = _ENCODER.encode


def _object(raw: bytes | None) -> dict[str, Any]:
    """The JSON object a record value holds."""
    if raw is None:
        raise InvalidSample("empty record (null value)")
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidSample(f"not valid JSON: {json_error(exc)}") from exc
    if type(doc) is not dict:
        raise InvalidSample(f"expected a JSON object, got {type(doc).__name__}")
    return doc


def _is_id(value: object) -> bool:
    return type(value) is str and value != ""


def _is_id_list(value: object) -> bool:
    if type(value) is not list:
        return False
    try:
        "".join(value)  # refuses any non-string in C: the cheapest full check (~5 ns an id)
    except TypeError:
        return False
    return "" not in value


def _reason(doc: dict[str, Any]) -> str:
    """Why a sample with every field present failed the combined check: the first problem."""
    for name in _IDS:
        if not _is_id(doc[name]):
            return f"field {name!r} must be a non-empty string, got {_show(doc[name])}"
    ts, label = doc["ts"], doc["label"]
    if not (type(ts) is int and MIN_TS_MS <= ts <= MAX_TS_MS):
        return f"field 'ts' must be integer epoch milliseconds in [{MIN_TS_MS}, {MAX_TS_MS}], got {_show(ts)}"
    if not (type(label) is int and label in (0, 1)):
        return f"field 'label' must be 0 or 1 (an integer), got {_show(label)}"
    for name in _SEQUENCES:
        if not _is_id_list(doc[name]):
            return f"field {name!r} must be a list of non-empty strings, got {_bad_element(doc[name])}"
    items, categories = doc["seq_items"], doc["seq_categories"]
    return f"sequences differ in length: {len(items)} seq_items but {len(categories)} seq_categories"


def _bad_element(value: object) -> str:
    """What breaks "a list of non-empty strings": the value itself, or its first bad element."""
    if type(value) is not list:
        return _show(value)
    index, element = next((i, v) for i, v in enumerate(value) if not _is_id(v))
    what = "an empty string" if element == "" else _show(element)
    return f"{what} at index {index}"


def _show(value: object) -> str:
    """A value for a reason: bounded, and with its type where its repr hides it."""
    return "null" if value is None else f"{_SHOW.repr(value)} ({type(value).__name__})"
