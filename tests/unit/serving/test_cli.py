"""`streamrec snapshot export` and `streamrec score` from the command line."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from streamrec.cli import app
from streamrec.serving.export import export_dir
from tests.support import trained_snapshots


def test_export_then_score_the_promoted_version(tmp_path: Path) -> None:
    store = trained_snapshots(tmp_path, count=2)
    shutil.rmtree(export_dir(tmp_path, 2))  # as for a version written before exports existed
    runner = CliRunner()
    result = runner.invoke(app, ["snapshot", "export", "2", "--json", "--snapshot-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    doc = orjson.loads(result.stdout)
    assert doc["path"] == str(export_dir(tmp_path, 2)) and "model.pdiparams" in doc["files"]

    args = ["score", "--user", "u1", "--items", "i1:c1,i2", "--no-store", "--snapshot-dir", str(tmp_path)]
    refused = runner.invoke(app, args)
    assert refused.exit_code == 1 and "no promoted version" in refused.output
    store.promote(2)
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    doc = orjson.loads(result.stdout)
    assert doc["version"] == 2 and len(doc["scores"]) == 2
    assert all(0 < s < 1 for s in doc["scores"])


@pytest.mark.parametrize("command", [["score", "--user", "u1", "--items", "i1", "--no-store"], ["serve"]])
def test_a_mistyped_snapshot_dir_is_named_as_missing(command: list[str], tmp_path: Path) -> None:
    # Found by a tour of docs/operating/faults.md: `serve` and `score --snapshot-dir /nope` said
    # "no promoted version in /nope: run `streamrec snapshot promote VERSION`", which then said
    # there is no such directory; the snapshot commands name it at once.
    missing = tmp_path / "nope"
    result = CliRunner().invoke(app, [*command, "--snapshot-dir", str(missing)])
    assert result.exit_code == 1
    assert result.output == (
        f"error: no snapshot directory {missing}: check --snapshot-dir (STREAMREC_LEARNER__SNAPSHOT_DIR)\n"
    )
    assert not missing.exists()


@pytest.fixture(scope="module")
def promoted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("promoted")
    trained_snapshots(root, count=1).promote(1)
    return root


def test_score_json_gives_every_candidate_in_order_as_post_score_does(promoted: Path) -> None:
    """``--items 1,1,1:Comedy --json`` printed {"scores": {"1": ...}}: one score of three,
    labelled by item id. It is a list in candidate order, as POST /score answers.
    """
    args = ["score", "--user", "u1", "--no-store", "--snapshot-dir", str(promoted), "--json"]
    result = CliRunner().invoke(app, [*args, "--items", "1,1,1:Comedy,2"])
    assert result.exit_code == 0, result.output
    scores = orjson.loads(result.stdout)["scores"]
    assert isinstance(scores, list) and len(scores) == 4 and scores[0] == scores[1]
    alone = orjson.loads(CliRunner().invoke(app, [*args, "--items", "2"]).stdout)["scores"]
    assert alone == [scores[3]]


@pytest.mark.parametrize(("option", "value", "why"), [
    ("--items", "", "'items' must be a non-empty list"),
    ("--items", " ", "must be a non-empty list"),
    ("--items", ":Comedy", "field 'item' must have 1..128 characters"),
    ("--items", "1,,2", "an item is a non-empty string"),
    ("--items", "x" * 300, "1..128"),
    ("--items", "a\x07b", "not printable"),
    # Found by a tour of docs/your-features.md: one item object without its list's brackets was
    # split at its commas and scored as two items, '{"item_id": "i7"' and ' "category_id": "c2"}'.
    ("--items", '{"item_id": "i7", "category_id": "c2"}', "'items' must be a non-empty list"),
    ("--user", "", "user"),
    ("--user", "u" * 300, "1..128"),
    ("--user", "u\nv", "not printable"),
])
def test_score_refuses_the_ids_post_score_refuses_in_one_line(
    promoted: Path, option: str, value: str, why: str
) -> None:
    args = {"--user": "u1", "--items": "1,2"} | {option: value}
    result = CliRunner().invoke(app, ["score", *(x for kv in args.items() for x in kv), "--no-store",
                                      "--snapshot-dir", str(promoted)])
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"error: {option}:") and why in result.output, result.output
    assert "Traceback" not in result.output and "version v0" not in result.output
