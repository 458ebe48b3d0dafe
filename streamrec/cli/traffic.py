"""``streamrec snapshot canary|ab``: traffic between versions (`streamrec.snapshots.canary`).

``canary VERSION --share 5%`` sends a stable 5% of users (by user-id hash) to VERSION while the
rest stay on the served one; run again to change the share, ``--promote`` to make it served
(as ``snapshot promote VERSION`` does), ``--abort`` to end it (as ``snapshot rollback`` does).
``ab NAME=VERSION:SHARE ...`` splits users between fixed versions until ``ab --end``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from streamrec.cli.common import cli_errors, console, print_json
from streamrec.cli.options import ConfigFile, LogLevel
from streamrec.cli.snapshot_common import (
    DirOption,
    JsonOption,
    build_export,
    current_plan,
    open_store,
    plan_doc,
    serve_check,
    version_name,
)

if TYPE_CHECKING:
    from streamrec.snapshots.store import SnapshotStore
    from streamrec.snapshots.traffic import Arm

ReasonOption = typer.Option("manual", help="Why, for the serving history")


def canary(
    version: str | None = typer.Argument(None, help="The candidate: v000008, 8 or latest"),
    share: str = typer.Option("5%", "--share", help="Share of users sent to it: 5%, 0.5%..."),
    promote: bool = typer.Option(False, "--promote", help="End the running canary making it served"),
    abort: bool = typer.Option(False, "--abort", help="End the running canary: all users on the served one"),
    reason: str = ReasonOption,
    snapshot_dir: Path | None = DirOption,
    as_json: bool = JsonOption,
    log_level: str | None = LogLevel,
    config_file: Path | None = ConfigFile,
) -> None:
    """Send a stable share of users (by user-id hash) to VERSION; the rest stay on the served
    version. `streamrec serve` follows it within its poll, reports each arm on /metrics and
    ends it by itself when the canary falls behind (STREAMREC_SERVING__CANARY_ERROR_MARGIN,
    STREAMREC_SERVING__CANARY_LATENCY_RATIO).
    """
    from streamrec.errors import SnapshotError
    from streamrec.snapshots.canary import start_canary
    from streamrec.snapshots.traffic import CANARY, parse_share

    with cli_errors():
        store = open_store(snapshot_dir, log_level, config_file)
        if version is not None and (promote or abort):
            raise SnapshotError("--promote and --abort end the running canary: give no VERSION")
        if promote + abort + (version is not None) != 1:
            raise SnapshotError("give one of: a VERSION (with --share), --promote, --abort")
        if abort:
            _end(store, reason, as_json, "canary")
            return
        if promote:
            plan = current_plan(store)
            arm = plan.arm(CANARY) if plan is not None else None
            if plan is None or arm is None or arm.version is None:
                raise SnapshotError(f"no canary runs in {store.root}: nothing to promote")
            manifest = store.promote(
                arm.version, reason=reason, build_export=build_export(store), serve_check=serve_check(store)
            )
            _said(
                as_json,
                {"current": manifest.version, "traffic": None},
                f"canary promoted: serving {manifest.name} to every user",
            )
            return
        assert version is not None
        number = store.resolve(version)
        plan = start_canary(
            store, number, parse_share(share), reason, build_export(store), serve_check(store)
        )
        _said(as_json, {"traffic": plan_doc(plan)}, f"canary started: {plan.describe()}")


def ab(
    arms: list[str] | None = typer.Argument(
        None,
        help="NAME=VERSION:SHARE (control=current:50%) or VERSION=SHARE (v000008=50%), "
        "shares summing to 100%",
    ),
    name: str | None = typer.Option(
        None,
        "--name",
        help="The experiment's name: it deals users to arms (a new name deals anew)",
        show_default="ab-<arm>.<version>-...",
    ),
    end: bool = typer.Option(False, "--end", help="End the running A/B test: all users on the served one"),
    reason: str = ReasonOption,
    snapshot_dir: Path | None = DirOption,
    as_json: bool = JsonOption,
    log_level: str | None = LogLevel,
    config_file: Path | None = ConfigFile,
) -> None:
    """Split users between fixed versions by fixed shares (by user-id hash) until --end; each
    /score response names its arm and version, and /metrics reports each arm.
    """
    from streamrec.errors import SnapshotError
    from streamrec.snapshots.canary import start_ab

    with cli_errors():
        store = open_store(snapshot_dir, log_level, config_file)
        if end == bool(arms):
            raise SnapshotError("give the arms (NAME=VERSION:SHARE ...), or --end")
        if end:
            _end(store, reason, as_json, "ab")
            return
        arms_ = [parse_arm(store, text) for text in arms or ()]
        plan = start_ab(store, arms_, name, reason, build_export(store), serve_check(store))
        _said(as_json, {"traffic": plan_doc(plan)}, f"A/B test started: {plan.describe()}")


def parse_arm(store: SnapshotStore, text: str) -> Arm:
    """``NAME=VERSION:SHARE`` or ``VERSION=SHARE`` (the arm named after its version).

    Raises:
        SnapshotError: naming the arm that does not parse or names no version.
    """
    from streamrec.errors import SnapshotError
    from streamrec.snapshots.traffic import Arm, parse_share

    left, eq, right = text.partition("=")
    if not eq or not left or not right:
        raise SnapshotError(f"arm {text!r}: give NAME=VERSION:SHARE or VERSION=SHARE")
    arm_name, spec, share = (left, *right.rsplit(":", 1)) if ":" in right else (None, left, right)
    version = store.resolve(spec)
    return Arm(arm_name or version_name(version), version, parse_share(share))


def _end(store: SnapshotStore, reason: str, as_json: bool, kind: str) -> None:
    from streamrec.snapshots.canary import end_plan

    plan = end_plan(store, reason, kind=kind)
    assert plan is not None  # end_plan raises when none runs
    current = store.current()
    _said(
        as_json,
        {"current": current, "ended": plan_doc(plan), "traffic": None},
        f"{plan.kind} ended: serving {version_name(current or 0)} to every user",
    )


def _said(as_json: bool, doc: dict[str, Any], text: str) -> None:
    if as_json:
        print_json(doc)
    else:
        console.print(text, highlight=False)


def register(app: typer.Typer) -> None:
    """Add ``canary`` and ``ab`` to the snapshot group."""
    app.command("canary")(canary)
    app.command("ab")(ab)
