"""The sample contract: valid samples round-trip, every kind of malformed one has a reason.

The learner decodes with `Sample.from_json`; whatever it refuses is dead-lettered, so
nothing malformed can reach training (``label: null`` once turned every weight to NaN).
"""

from __future__ import annotations

import orjson
import pytest

from streamrec.errors import InvalidSample, StreamrecError
from streamrec.samples import _DECODER, MAX_TS_MS, MIN_TS_MS, Sample, _checked, parse_sample
from tests.support import decoder_agreement

TS = 1_511_658_000_000


def doc(**over: object) -> bytes:
    """A valid sample's wire form with fields replaced (``...`` removes one)."""
    base: dict[str, object] = {
        "sample_id": "e1~n0", "user_id": "u7", "ts": TS, "item_id": "i9", "category_id": "c3",
        "label": 1, "seq_items": ["i1", "i2"], "seq_categories": ["c1", "c2"],
    }
    base.update(over)
    return orjson.dumps({k: v for k, v in base.items() if v is not ...})


def test_valid_sample_round_trips() -> None:
    sample = Sample.from_json(doc())
    assert sample == Sample("e1~n0", "u7", TS, "i9", "c3", 1, ("i1", "i2"), ("c1", "c2"))
    assert Sample.from_json(sample.to_json()) == sample
    assert parse_sample(sample.to_json()) == sample


def test_empty_sequences_label_zero_and_unknown_fields_are_valid() -> None:
    sample = parse_sample(doc(label=0, seq_items=[], seq_categories=[], extra={"page": "home"}))
    assert (sample.label, sample.seq_items, sample.seq_categories) == (0, (), ())


def test_ts_bounds_are_inclusive() -> None:
    assert parse_sample(doc(ts=MIN_TS_MS)).ts == MIN_TS_MS
    assert parse_sample(doc(ts=MAX_TS_MS)).ts == MAX_TS_MS


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        # The ten kinds found by testing the learner from outside, then label 2, 0.5, ts < 0.
        pytest.param(b'{"sample_id": "e1", ', "not valid JSON", id="bad-json"),
        pytest.param(None, "null value", id="null-value"),
        pytest.param(doc(seq_items=...), "missing field(s): seq_items", id="missing-seq-items"),
        pytest.param(
            doc(seq_categories=["c1"]), "2 seq_items but 1 seq_categories", id="lengths-differ"
        ),
        pytest.param(doc(ts="1511658000000"), "field 'ts' must be", id="string-ts"),
        pytest.param(doc(item_id=9), "field 'item_id' must be a non-empty string", id="int-item-id"),
        pytest.param(b'[{"sample_id": "e1"}]', "expected a JSON object, got list", id="json-array"),
        pytest.param(doc(label=None), "field 'label' must be 0 or 1", id="label-null"),
        pytest.param(doc(user_id=""), "field 'user_id' must be a non-empty string", id="empty-id"),
        pytest.param(doc(seq_items="i1"), "field 'seq_items' must be a list", id="seq-is-string"),
        pytest.param(doc(label=2), "field 'label' must be 0 or 1", id="label-2"),
        pytest.param(doc(label=0.5), "field 'label' must be 0 or 1", id="label-half"),
        pytest.param(doc(ts=-1), "field 'ts' must be", id="negative-ts"),
        # Beyond the ten.
        pytest.param(b"", "not valid JSON", id="empty-bytes"),
        pytest.param(b"\xff\xfe", "not valid JSON", id="not-utf8"),
        pytest.param(b'"a string"', "expected a JSON object, got str", id="json-string"),
        pytest.param(b"null", "expected a JSON object, got NoneType", id="json-null"),
        pytest.param(doc(label=True), "field 'label' must be 0 or 1", id="label-bool"),
        pytest.param(doc(label=1.0), "field 'label' must be 0 or 1", id="label-float"),
        pytest.param(doc(ts=1_511_658_000), "field 'ts' must be", id="ts-in-seconds"),
        pytest.param(doc(ts=float(TS)), "field 'ts' must be", id="float-ts"),
        pytest.param(doc(ts=2**63), "field 'ts' must be", id="ts-beyond-int64"),
        pytest.param(doc(ts=True), "field 'ts' must be", id="bool-ts"),
        pytest.param(doc(sample_id=None), "field 'sample_id' must be", id="null-id"),
        pytest.param(doc(category_id=["c"]), "field 'category_id' must be", id="list-id"),
        pytest.param(doc(seq_items=["i1", 2]), "2 (int) at index 1", id="int-in-seq"),
        pytest.param(doc(seq_categories=["c1", ""]), "an empty string at index 1", id="empty-in-seq"),
        pytest.param(doc(seq_categories=None), "field 'seq_categories' must be a list", id="null-seq"),
        pytest.param(
            doc(user_id=..., label=...), "missing field(s): user_id, label", id="missing-two"
        ),
    ],
)
def test_malformed_samples_raise_invalid_sample_with_reason(raw: bytes | None, reason: str) -> None:
    with pytest.raises(InvalidSample) as info:
        Sample.from_json(raw)
    assert reason in str(info.value)
    assert isinstance(info.value, StreamrecError)


def test_a_reason_stays_short_for_a_huge_value() -> None:
    with pytest.raises(InvalidSample) as info:
        parse_sample(doc(ts="x" * 100_000))
    assert len(str(info.value)) < 200


_ODD = [
    "", "x", "\ud800", 0, 1, 2, -1, 2**70, 1.5, 1.0, True, False, None, [], {}, ["i1"], ["i1", ""],
    ["i1", 3], ["i1", "i2"], ("i1", None), MIN_TS_MS - 1, MIN_TS_MS, MAX_TS_MS, MAX_TS_MS + 1, float(TS), ...,
]


def test_the_decoder_accepts_nothing_the_field_checks_refuse() -> None:
    """The C decoder's common case and the field-by-field checks agree on every record: each
    field replaced by odd values, one at a time and in random pairs.
    """
    fast = decoder_agreement(orjson.loads(doc()), _ODD, parse_sample, _checked, _DECODER, InvalidSample)
    assert fast > 10  # the decoder took the common case itself


def test_a_sample_nested_past_the_parsers_depth_is_invalid_not_a_crash() -> None:
    """Found by the consumers tour: the events' ``RecursionError`` (see test_events.py) in the
    learner's decoder too, which would stop every learner at that sample.
    """
    raw = b'{"sample_id":"s","x":%s%s}' % (b"[" * 5_000, b"]" * 5_000)
    with pytest.raises(InvalidSample, match="not valid JSON: .*depth"):
        parse_sample(raw)
