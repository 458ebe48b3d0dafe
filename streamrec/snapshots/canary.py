"""Starting and ending traffic plans (`streamrec.snapshots.traffic`): canaries and A/B tests.

Each runs under the serving pointer's lock and records itself in the serving history (actions
``canary``, ``ab`` and ``end``, the plan described in the event's ``traffic``) before the plan
file changes, as promotions do. Every version an arm serves is verified, its export with it,
before any user is sent to it. Promote (`streamrec.snapshots.promotion.promote`) of an arm's
version ends a plan with that version served; rollback ends it with the served one kept.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from streamrec.errors import SnapshotError
from streamrec.snapshots.directory import version_name
from streamrec.snapshots.promotion import (
    BuildExport,
    ServeCheck,
    Versions,
    _require_export,
    _require_finite,
    end_traffic,
)
from streamrec.snapshots.traffic import BUCKETS, CANARY, SERVED, Arm, TrafficPlan, read_plan, write_plan

logger = logging.getLogger(__name__)

_A = {"canary": "a canary", "ab": "an A/B test"}  # a plan's kind, in a sentence


def start_canary(
    store: Versions,
    version: int,
    share: int,
    reason: str = "manual",
    build_export: BuildExport | None = None,
    serve_check: ServeCheck | None = None,
) -> TrafficPlan:
    """Send ``share`` basis points of users to ``version``; the rest stay on the served one.

    Run again for the same version to change its share: the salt stays, so users already in
    the canary stay in it when it grows.

    Raises:
        SnapshotError: nothing is served, the version is the served one, another plan runs,
            the share is not below 100%, or the version or its export fails a check.
    """
    if not 0 < share < BUCKETS:
        raise SnapshotError("a canary's share must be more than 0% and less than 100%")
    with store.serving.locked():
        current = _served(store)
        if version == current:
            raise SnapshotError(f"{version_name(version)} is the served version: canary another one")
        running = read_plan(store.root)
        canary = running.arm(CANARY) if running is not None else None
        if running is not None and (running.kind != "canary" or canary is None or canary.version != version):
            raise SnapshotError(
                f"a {running.kind} runs ({running.describe()}): end it first (`streamrec snapshot rollback`)"
            )
        _servable(store, version, build_export, serve_check)
        arms = (Arm(CANARY, version, share), Arm(SERVED, None, BUCKETS - share))
        plan = TrafficPlan("canary", f"canary-{version_name(version)}", arms, _now(), reason)
        store.serving.record("canary", current, current, reason, traffic=plan.describe())
        write_plan(store.root, plan)
    logger.info("canary started plan=%s reason=%s", plan.describe(), reason)
    return plan


def start_ab(
    store: Versions,
    arms: list[Arm],
    name: str | None = None,
    reason: str = "manual",
    build_export: BuildExport | None = None,
    serve_check: ServeCheck | None = None,
) -> TrafficPlan:
    """Split users between fixed versions by fixed shares until it is ended.

    ``name`` salts the users' hash: a new name deals users anew; the same name and arms
    give every user the arm they had.

    Raises:
        SnapshotError: the arms do not make a plan (shares not summing to 100%, names twice),
            nothing is served, another plan runs, or a version or its export fails a check.
    """
    salt = name or "ab-" + "-".join(f"{a.name}.{a.version}" for a in arms)
    plan = TrafficPlan("ab", salt, tuple(arms), _now(), reason)  # checks the shares first
    if any(a.version is None for a in arms):
        raise SnapshotError("every arm of an A/B test names its version")
    with store.serving.locked():
        current = _served(store)
        running = read_plan(store.root)
        if running is not None:
            raise SnapshotError(
                f"a {running.kind} runs ({running.describe()}): end it first (`streamrec snapshot rollback`)"
            )
        for version in sorted(plan.versions()):
            store.verify(version)  # each exists and is whole before any export is built
        for version in sorted(plan.versions()):
            _servable(store, version, build_export, serve_check)
        store.serving.record("ab", current, current, reason, traffic=plan.describe())
        write_plan(store.root, plan)
    logger.info("A/B test started plan=%s reason=%s", plan.describe(), reason)
    return plan


def end_plan(
    store: Versions, reason: str, expected: TrafficPlan | None = None, kind: str | None = None
) -> TrafficPlan | None:
    """End the running plan: every user back on the served version, which stays; returns it.

    With ``expected``, only that plan is ended (a serving instance that judged it): when it
    has ended or changed already (another instance, an operator), nothing happens and None
    is returned, so of several instances one decides. With ``kind`` (``canary`` or ``ab``:
    ``canary --abort``, ``ab --end``), only a plan of that kind: a canary is a candidate on
    its way to promotion, an A/B test an experiment between fixed versions, and ending one
    is never what the command for the other meant (``snapshot rollback`` ends either).

    Raises:
        SnapshotError: no plan runs (without ``expected``), one of another ``kind`` runs, or
            the history cannot be written.
    """
    with store.serving.locked():
        running = read_plan(store.root)
        if running is None and expected is None:
            what = _A[kind].split(" ", 1)[1] if kind else "canary or A/B test"
            raise SnapshotError(f"no {what} runs in {store.root}: nothing to end")
        if running is not None and kind is not None and running.kind != kind:
            ends = "`streamrec snapshot " + ("canary --abort`" if running.kind == "canary" else "ab --end`")
            raise SnapshotError(
                f"{_A[kind]} does not run in {store.root}, {_A[running.kind]} does ({running.describe()}): "
                f"left running; {ends} (or `streamrec snapshot rollback`) ends it"
            )
        if running is None or (expected is not None and _key(running) != _key(expected)):
            return None
        end_traffic(store, running, reason)
    return running


def _key(plan: TrafficPlan) -> tuple[str, str, tuple[Arm, ...]]:
    return plan.kind, plan.salt, plan.arms


def _served(store: Versions) -> int:
    current = store.serving.current()
    if current is None:
        raise SnapshotError(f"no version is promoted in {store.root}: promote one before splitting traffic")
    return current


def _servable(
    store: Versions, version: int, build_export: BuildExport | None, serve_check: ServeCheck | None
) -> None:
    """Refuse a version serving could not load: damaged, or its export missing or not loadable.

    Missing even after ``build_export``; not loadable by `streamrec serve` as ``serve_check`` says.
    """
    store.verify(version)
    _require_finite(store, version)
    if _require_export(store, version, build_export, serve_check).missing:
        raise SnapshotError(
            f"{version_name(version)} has no export, so serving cannot load it: "
            f"build one with `streamrec snapshot export {version}`"
        )


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")
