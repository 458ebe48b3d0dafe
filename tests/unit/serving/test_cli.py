"""`streamrec snapshot export` and `streamrec score` from the command line."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
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
    assert doc["version"] == 2 and set(doc["scores"]) == {"i1", "i2"}
    assert all(0 < s < 1 for s in doc["scores"].values())
