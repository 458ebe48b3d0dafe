"""What the ``streamrec snapshot`` commands share (`streamrec.cli.snapshot`, `streamrec.cli.traffic`).

The snapshot directory option, ``--json`` output, opening the store, building a missing
export, and the traffic plan as the listings show it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from streamrec.cli.common import build_config, err_console
from streamrec.cli.options import json_output, setting

if TYPE_CHECKING:  # numpy, pydantic: imported when a command runs, not for --help
    from streamrec.snapshots.exports import ExportCheck
    from streamrec.snapshots.store import SnapshotStore
    from streamrec.snapshots.traffic import Arm, TrafficPlan

DirOption = setting("learner.snapshot_dir")
JsonOption = json_output()


def open_store(snapshot_dir: Path | None, log_level: str | None, config_file: Path | None) -> SnapshotStore:
    """The snapshot store the options and the configuration name (no lock taken).

    Raises:
        SnapshotError: the directory does not exist (a mistyped ``--snapshot-dir``): every
            command here reads or acts on versions already written, and would otherwise say
            "no snapshots" with exit status 0, name a file missing under it, or create it.
    """
    from streamrec.snapshots.pointer import require_root
    from streamrec.snapshots.store import SnapshotStore

    cfg = build_config(
        quiet=True, log_level=log_level, config_file=config_file, learner={"snapshot_dir": snapshot_dir}
    )
    require_root(cfg.learner.snapshot_dir)
    return SnapshotStore(cfg.learner.snapshot_dir)


def served(store: SnapshotStore) -> tuple[int | None, str | None]:
    """The version ``serving/CURRENT`` names (None: none) and why it cannot be read (None: it can).

    An unreadable pointer is a warning on stderr, not an error: the listings are how an
    operator chooses the version to promote, which replaces it.
    """
    from streamrec.errors import SnapshotError

    try:
        return store.current(), None
    except SnapshotError as exc:
        err_console.print(f"[yellow]warning:[/yellow] {escape(str(exc))}", highlight=False)
        return None, str(exc)


def version_problem(store: SnapshotStore, version: int, problem: str | None) -> str | None:
    """``problem`` (why ``version`` failed its checksums), or for one that passed, why its state
    is not loaded (NaN or infinite values: `SnapshotStore.state_problem`), or None.
    """
    from streamrec.errors import SnapshotError

    if problem is not None:
        return problem
    try:
        return store.state_problem(version)
    except SnapshotError as exc:
        return str(exc)


def version_name(version: int) -> str:
    """``v000007``: `streamrec.snapshots.store.version_name`, imported when called."""
    from streamrec.snapshots.store import version_name as name

    return name(version)


def build_export(store: SnapshotStore) -> Callable[[int], Path | None]:
    """Build a version's missing export, saying so (serving could not load it otherwise)."""

    def build(version: int) -> Path | None:
        from streamrec.serving.export import build_missing_export

        path = build_missing_export(store, version)
        if path is not None:
            err_console.print(f"{version_name(version)} had no export: built {path}", highlight=False)
        return path

    return build


def serve_check(store: SnapshotStore) -> Callable[[int], ExportCheck]:
    """What `streamrec serve` makes of a version's export, for promotion
    (`streamrec.serving.loading.serve_check`).
    """
    from streamrec.serving.loading import serve_check as check

    return check(store.root)


def current_plan(store: SnapshotStore) -> TrafficPlan | None:
    """The traffic plan in force in ``store``'s directory, if any."""
    from streamrec.snapshots.traffic import read_plan

    return read_plan(store.root)


def plan_doc(plan: TrafficPlan | None) -> dict[str, Any] | None:
    """A plan as JSON (``--json`` of list, show, canary and ab)."""
    if plan is None:
        return None
    arms = [arm_doc(a) for a in plan.arms]
    doc = {"kind": plan.kind, "salt": plan.salt, "started": plan.started, "reason": plan.reason}
    return doc | {"arms": arms}


def arm_doc(arm: Arm) -> dict[str, Any]:
    """An arm as JSON: its name, version (None: the served one) and share in percent."""
    return {"name": arm.name, "version": arm.version, "share": arm.share / 100}


def arm_docs(plan: TrafficPlan | None, version: int, current: int | None) -> list[dict[str, Any]]:
    """The arms ``version`` answers in ``plan``, as in the plan's JSON (`arm_doc`); [] for none."""
    return [arm_doc(a) for a in _arms_of(plan, version, current)]


def arms_of(plan: TrafficPlan | None, version: int, current: int | None) -> str:
    """The arms ``version`` serves in ``plan`` (``canary 5.00%``), or ``""``."""
    from streamrec.snapshots.traffic import format_share

    return ", ".join(f"{a.name} {format_share(a.share)}" for a in _arms_of(plan, version, current))


def _arms_of(plan: TrafficPlan | None, version: int, current: int | None) -> list[Arm]:
    if plan is None:
        return []
    return [a for a in plan.arms if a.version == version or (a.version is None and version == current)]
