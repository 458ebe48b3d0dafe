"""The optional ``vw`` strategy: Vowpal Wabbit examples from samples, and an online linear
learner on the backtester's micro-batches (skipped only where vowpalwabbit is not installed).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from streamrec.cli import app
from streamrec.errors import ConfigError
from streamrec.learner.columns import SampleColumns
from streamrec.replay.backtest import backtest
from streamrec.replay.vw import NAMESPACES, examples, vw_token
from streamrec.samples import Sample
from tests.unit.replay.test_backtest import config

ODD = Sample(
    "s1", "user 1", 5, "a|b:c", "x\ty", 1, ("a|b:c", "d e", "%7C"), ("x\ty", "z", "z")
)


def _tokens(line: str) -> dict[str, list[str]]:
    """Namespace letter -> its tokens, splitting as VW does: on ``|``, then on whitespace."""
    label, *spaces = line.split("|")
    out = {"label": label.split()}
    for space in spaces:
        name, *tokens = space.split()
        out[name] = tokens
    return out


def test_an_example_names_every_id_once_per_namespace_with_separators_escaped() -> None:
    batch = SampleColumns.from_samples([ODD])
    line = examples(batch, labelled=True)[0]
    tokens = _tokens(line)
    assert tokens["label"] == ["1"]
    assert set(tokens) == {"label", *NAMESPACES.values()}
    assert tokens[NAMESPACES["user"]] == ["user%201"]
    assert tokens[NAMESPACES["item"]] == ["a%7Cb%3Ac"]
    assert tokens[NAMESPACES["category"]] == ["x%09y"]
    # the history: every behaviour, in order; a literal "%7C" id stays apart from "|"
    assert tokens[NAMESPACES["history_items"]] == ["a%7Cb%3Ac", "d%20e", "%257C"]
    assert tokens[NAMESPACES["history_categories"]] == ["x%09y", "z", "z"]
    features = dict(t.split(":") for t in tokens[NAMESPACES["features"]])
    assert float(features["target_in_history"]) == 1.0
    assert float(features["category_share"]) == pytest.approx(1 / 3)
    # unlabelled (scoring) examples carry no label; a negative is -1 (logistic loss)
    assert _tokens(examples(batch, labelled=False)[0])["label"] == []
    negative = SampleColumns.from_samples([Sample("s2", "u", 6, "i", "c", 0, (), ())])
    assert _tokens(examples(negative, labelled=True)[0])["label"] == ["-1"]


@pytest.mark.parametrize("raw", ["a b", "a|b", "a:b", "a%b", "a\nb", "a\rb", "%20", "plain"])
def test_escaping_is_reversible_and_leaves_no_separator(raw: str) -> None:
    token = vw_token(raw)
    assert not set(token) & set("| :\t\n\r")
    assert _unescape(token) == raw


def _unescape(token: str) -> str:
    from urllib.parse import unquote

    return unquote(token)


def test_selecting_vw_without_the_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vowpalwabbit", None)  # import fails as if not installed
    with pytest.raises(ConfigError, match=r"pip install 'streamrec\[vw\]'"):
        backtest(config(strategies=("vw",)))
    result = CliRunner().invoke(app, ["replay", "backtest", "synthetic:events=300", "--strategies", "vw"])
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "pip install 'streamrec[vw]'" in lines[0], result.output


@pytest.fixture(scope="module")
def vw_report() -> dict[str, Any]:
    pytest.importorskip("vowpalwabbit", reason="the vw extra is not installed: pip install 'streamrec[vw]'")
    return backtest(config(strategies=("vw", "item-rate")))


def test_vw_learns_online_from_the_same_samples(vw_report: dict[str, Any]) -> None:
    vw = vw_report["strategies"]["vw"]
    assert vw["kind"] == "vw" and vw["series"]["samples"] == vw_report["micro_batches"]["samples"]
    assert vw["series"]["gauc"][0] == 0.5  # scored before any training: every score alike
    assert vw["gauc"] > 0.6 and vw["gauc_last_3q"] > vw["series"]["gauc"][0]
    assert backtest(config(strategies=("vw", "item-rate")))["digest"] == vw_report["digest"]


def test_vw_state_round_trips() -> None:
    pytest.importorskip("vowpalwabbit", reason="the vw extra is not installed: pip install 'streamrec[vw]'")
    from streamrec.replay.vw import VWLearner

    first = SampleColumns.from_samples([ODD, Sample("s2", "u", 6, "i", "c", 0, ("d e",), ("z",))])
    a = VWLearner()
    a.learn_many(first)
    b = VWLearner()
    b.load_state_arrays(a.state_arrays())
    assert np.array_equal(a.predict_many(first), b.predict_many(first))
    assert a.is_known(first).tolist() == [True, True] and b.is_known(first).tolist() == [True, True]
