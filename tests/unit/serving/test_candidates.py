"""A request's candidates and history read the default schema's features by name."""

from __future__ import annotations

from streamrec.features import BUILTIN
from streamrec.serving.features import PAIR, Candidate


def test_a_candidate_gives_each_builtin_features_id_by_name() -> None:
    assert [Candidate("i1", "c1").target_id(f.name) for f in BUILTIN] == ["i1", "c1"]
    assert Candidate.parse("i2").target_id("category") is None  # reads the table's default row


def test_a_history_pair_holds_the_builtin_features_in_schema_order() -> None:
    assert PAIR == tuple(f.name for f in BUILTIN) == ("item", "category")
