"""``streamrec snapshot canary|ab`` refuse bad input with one clear line and exit status 1."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from streamrec.cli import app
from streamrec.snapshots.store import SnapshotStore
from tests.unit.snapshots.test_snapshot import write


@pytest.fixture
def snapshot_dir(tmp_path: Path) -> Path:
    store = SnapshotStore(tmp_path)
    for _ in range(3):
        write(store)  # no model in them, so no export can be built
    store.promote(1)
    return tmp_path


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["canary", "v000099"], "v000099"),
        (["canary", "2", "--share", "150%"], "share '150%' must be more than 0% and at most 100%"),
        (["canary", "2", "--share", "100%"], "a canary's share must be more than 0% and less than 100%"),
        (["canary", "2"], "v000002 has no export, so serving cannot load it"),
        (["canary", "1"], "v000001 is the served version"),
        (["canary"], "give one of: a VERSION (with --share), --promote, --abort"),
        # found by a tour: `canary 2 --abort` said to give a VERSION or --abort, given both
        (["canary", "2", "--abort"], "--promote and --abort end the running canary: give no VERSION"),
        (["canary", "2", "--promote"], "--promote and --abort end the running canary: give no VERSION"),
        (["canary", "--promote", "--abort"], "give one of: a VERSION (with --share), --promote, --abort"),
        (["canary", "--promote"], "no canary runs"),
        (["canary", "--abort"], "no canary runs"),
        (["ab", "a=1:50%", "b=2:40%"], "shares must sum to 100%, not 50.00% + 40.00% = 90.00%"),
        (["ab", "a=1:50%", "a=2:50%"], "arm names must differ"),
        (["ab", "a=1:50%", "b=v000042:50%"], "v000042"),
        (["ab", "1=50%", "2=50%"], "v000001 has no export"),
        (["ab", "a"], "arm 'a': give NAME=VERSION:SHARE or VERSION=SHARE"),
        (["ab", "--end"], "no A/B test runs"),
        (["ab"], "give the arms (NAME=VERSION:SHARE ...), or --end"),
    ],
)
def test_traffic_errors_are_one_clear_line(snapshot_dir: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["snapshot", *args, "--snapshot-dir", str(snapshot_dir)])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.output
    assert not (snapshot_dir / "serving" / "TRAFFIC.json").exists()
