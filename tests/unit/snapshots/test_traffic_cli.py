"""``streamrec snapshot canary|ab`` refuse bad input with one clear line and exit status 1."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from streamrec.cli import app
from streamrec.snapshots.store import SnapshotStore
from streamrec.snapshots.traffic import Arm, TrafficPlan, write_plan
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


def test_json_arms_are_a_list_of_the_plans_arms_empty_for_none(snapshot_dir: Path) -> None:
    # found by a tour: `list --json` gave "served 80.00%" for a version in an arm and "" for one
    # in none, a display string to parse; now the plan's own arm objects, [] for none
    def json_of(*args: str) -> Any:
        result = CliRunner().invoke(app, ["snapshot", *args, "--json", "--snapshot-dir", str(snapshot_dir)])
        assert result.exit_code == 0, result.output
        return orjson.loads(result.stdout)

    assert [v["arms"] for v in json_of("list")["versions"]] == [[], [], []]  # no plan
    arms = (Arm("control", 1, 6000), Arm("treatment", 2, 3000), Arm("more", 1, 1000))
    plan = TrafficPlan("ab", "x", arms, "t", "r")
    write_plan(snapshot_dir, plan)
    control, treatment, more = json_of("list")["traffic"]["arms"]
    assert [v["arms"] for v in json_of("list")["versions"]] == [[control, more], [treatment], []]
    assert treatment == {"name": "treatment", "version": 2, "share": 30.0}
    assert json_of("show", "1")["arms"] == [control, more] and json_of("show", "3")["arms"] == []
    canary = TrafficPlan("canary", "c", (Arm("canary", 2, 2000), Arm("served", None, 8000)), "t", "r")
    write_plan(snapshot_dir, canary)
    served = {"name": "served", "version": None, "share": 80.0}
    in_canary = {"name": "canary", "version": 2, "share": 20.0}
    assert [v["arms"] for v in json_of("list")["versions"]] == [[served], [in_canary], []]
