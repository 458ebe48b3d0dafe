"""Every dead-letter reason the consumers and the learner can write lands in a kind that says it.

Found by the consumers tour: the learner's ``field 'seq_items' must be a list of non-empty
strings`` was counted as ``bad_id``, ``sequences differ in length`` and every declared feature's
reason (``feature 'price' (field 'price') must be a number``, a required one missing, one the
consumers declare otherwise) as ``other``. The reasons are read from the code (the messages of
`InvalidEvent` and `InvalidSample` and the functions that build reasons), so a reason added
without a row here fails `test_every_reason_in_the_code_has_a_row`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from streamrec.deadletters import KINDS, OTHER_REASON, reason_kind
from streamrec.errors import InvalidSample
from streamrec.samples import parse_sample

ROOT = Path(__file__).resolve().parents[2]
# Where reasons are written: the messages of these exceptions, and what these functions return
# (or processor's ``reason = f"..."``); a message given as anything else must be a known delegate.
_RAISED = ("InvalidEvent", "InvalidSample")
_BUILDERS = {
    "streamrec/samples.py": ("_reason",),
    "streamrec/features/schema.py": ("unprintable",),
    "streamrec/consumers/processor.py": ("late_reason",),
    "streamrec/consumers/placement.py": ("_reason", "_key_reason"),
    "streamrec/learner/intake.py": ("_wrong_kind",),
}
_SCANNED = (*_BUILDERS, "streamrec/events.py")
# Messages passed on whole: an exception's own (``str(exc)``), a builder's, a variable of one.
_DELEGATES = {"str(exc)", "reason", "r", "_reason(doc)", "unprintable(f'field {name!r}', text)",
              "unprintable(where, text)"}

# An example of each reason the code writes, by kind (each template in the code must match one).
REASONS: dict[str, tuple[str, ...]] = {
    "null_value": ("empty record (null value)",),
    "too_large": ("record is 300 bytes, over the 256-byte limit",),
    "not_json": (
        "not valid JSON: unexpected character: line 1 column 2 (char 1)",
        "not valid JSON: nested past the depth limit",
    ),
    "not_object": ("expected a JSON object, got list",),
    "missing_field": (
        "missing field(s): user_id, ts",
        "feature 'price' is required: field 'price' is missing",
    ),
    "bad_id": (
        "field 'item_id' must be a string or integer, got list",
        "field 'action' must be a string (the contract's), got int",
        "field 'user_id' must have 1..256 characters",
        "field 'item_id' contains U+00A0, which is not printable (a control, format or separator)",
        "field 'sample_id' must be a non-empty string, got null",
    ),
    "bad_timestamp": (
        "field 'ts' must be integer epoch milliseconds, got 'soon'",
        "field 'ts'=1700000000 looks like seconds: send epoch milliseconds",
        "field 'ts'=17000000000000000 is after the year 9999: send epoch milliseconds, not micro- or "
        "nanoseconds",
        "field 'ts' must be integer epoch milliseconds in [1000000000000, 253402300799999], got 5 (int)",
    ),
    "future_timestamp": ("field 'ts'=1800000000000 is 1000000 ms in the future",),
    "bad_label": (
        "field 'label' must be 0 or 1, got 2",
        "field 'label' must be 0 or 1 (an integer), got 2 (int)",
    ),
    "bad_sequence": (
        "field 'seq_items' must be a list of non-empty strings, got 'i1' (str)",
        "sequences differ in length: 2 seq_items but 1 seq_categories",
        "field 'seq_features' holds 1 values of 'price' for 2 seq_items",
    ),
    "bad_feature": (
        "feature 'tags' (field 'tags') must be a list of ids, got str",
        "feature 'tags' (field 'tags') has 40 ids, over its max_ids of 32",
        "feature 'price' (field 'price') must be a number, got str",
        "feature 'price' (field 'price') must be a finite number, got inf",
        "feature 'price' (field 'price') must be within float32's range (±3.403e+38), got 1e+300",
        "feature 'price' (field 'price') is inside the field 'features' (and 'tags'): declared features are "
        "top-level fields of the event, each at its field",
        "feature 'price' holds 1e+300, beyond float32's range (±3.403e+38): the consumers of this "
        "release refuse it: scale it, or give it a transform",
        "feature 'price' (field 'price') is log1p-transformed and must be above -1, got -2",
        "feature 'tags' (field 'tags') must hold string or integer ids, got float",
        "feature 'tags' (field 'tags') ids must have 1..256 characters",
    ),
    "feature_mismatch": (
        "feature 'price' is declared number and the sample holds id values: the consumers declare it "
        "otherwise (STREAMREC_FEATURES)",
    ),
    "conflicting_event_id": ("event id 'e1' reused with other content (first at 0:12)",),
    "late": (
        "late event: ts=1 is 5000 ms behind the newest event time seen on events[0] (allowed lateness 0 ms)",
    ),
    "no_key": ("record has no key: events are keyed by user_id (publish with key=user_id)",),
    "wrong_key": ("record key b'zz' is not the event's user_id 'u7': events are keyed by user_id",),
    "wrong_partition": (
        "user 'u1' belongs in events[2] by the murmur2_random partitioner over 3 partitions, not "
        "events[0]: ... Every producer must partition by murmur2_random, or "
        "STREAMREC_KAFKA__PARTITIONER name the one they share",
    ),
}
EXAMPLES = [(example, kind) for kind, examples in REASONS.items() for example in examples]


def _template(node: ast.expr | None) -> str | None:
    """A string's text, or an f-string's with {} for each value; None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(str(v.value) if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def _reasons_in_code() -> tuple[set[str], list[str]]:
    """The reason templates the code writes, and the messages it passes that are none of them."""
    found: set[str] = set()
    unknown: list[str] = []
    for name in _SCANNED:
        tree = ast.parse((ROOT / name).read_text())
        builders = _BUILDERS.get(name, ())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _RAISED:
                arg = node.args[0] if node.args else None
                text = _template(arg)
                if text is not None:
                    found.add(text)
                elif arg is None or ast.unparse(arg) not in _DELEGATES:
                    unknown.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
            elif isinstance(node, ast.FunctionDef) and node.name in builders:
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Return) and (text := _template(inner.value)):
                        found.add(text)
            elif (
                isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["reason"]
                and (text := _template(node.value))
            ):
                found.add(text)
    return found, unknown


def _matches(template: str, example: str) -> bool:
    pieces = [re.escape(piece) for piece in template.split("{}")]
    return re.fullmatch("(?s)" + ".*".join(pieces), example) is not None


def test_every_reason_in_the_code_has_a_row() -> None:
    found, unknown = _reasons_in_code()
    assert not unknown, f"a message neither literal nor a known delegate: {unknown}"
    assert len(found) >= 30
    unkinded = [t for t in found if not any(_matches(t, example) for example, _ in EXAMPLES)]
    assert not unkinded, "new reasons: add an example of each to REASONS, under its kind"
    stale = [e for e, _ in EXAMPLES if not any(_matches(t, e) for t in found)]
    assert not stale, "reasons no longer written: remove them from REASONS"


@pytest.mark.parametrize(("example", "kind"), EXAMPLES, ids=[e[:40] for e, _ in EXAMPLES])
def test_each_reason_lands_in_its_kind(example: str, kind: str) -> None:
    assert kind in KINDS and kind != OTHER_REASON
    assert reason_kind(example) == kind


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        (b'{"sample_id":"s","user_id":"u","ts":1700000000000,"item_id":"i","category_id":"c","label":1,'
         b'"seq_items":"i1","seq_categories":[]}', "bad_sequence"),
        (b'{"sample_id":"s","user_id":"u","ts":1700000000000,"item_id":"i","category_id":"c","label":1,'
         b'"seq_items":["a","b"],"seq_categories":["c"]}', "bad_sequence"),
        (b'{"sample_id":"","user_id":"u","ts":1700000000000,"item_id":"i","category_id":"c","label":1,'
         b'"seq_items":[],"seq_categories":[]}', "bad_id"),
    ],
    ids=["seq_items not a list", "sequences differ", "empty sample_id"],
)
def test_the_learners_reasons_as_written(raw: bytes, kind: str) -> None:
    with pytest.raises(InvalidSample) as caught:
        parse_sample(raw)
    assert reason_kind(str(caught.value)) == kind
