"""Automatic rollback of a canary whose live figures fall behind the served version's.

`CanaryGuard` keeps, per arm of the running canary, the requests and errors this instance
answered (reset whenever the plan changes) and the latencies of the current window. Once both
arms have answered ``canary_min_requests``, an error rate above the served one's by more than
``canary_error_margin`` ends the canary. Latency is judged by windows: each closes once both
arms have answered ``canary_min_requests`` in it, and a canary whose p99 latency is above
``canary_latency_ratio`` times the served one's plus ``canary_latency_slack_s`` in
``canary_latency_windows`` windows running is ended: a p99 of a few hundred requests rests on
their three slowest, which a pause of the whole process (a loaded machine) can make either
arm's, while a model really slower is slower in every window (docs/serving.md). Either
verdict ends the canary
(`streamrec.snapshots.canary.end_plan`), under the pointer's lock and only if the plan judged
is still the one in force, so of several instances one decides; the history says why. A
canary whose version this instance cannot load is ended the same way, and, with the click
join on and ``canary_ctr_margin`` set, one whose click-through (every instance's settled lists
and their clicks, from Redis: `streamrec.serving.clicks`) falls behind by that margin.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from streamrec.config import ServingConfig
from streamrec.errors import SnapshotError
from streamrec.serving.routing import Router
from streamrec.snapshots.canary import end_plan
from streamrec.snapshots.directory import version_name
from streamrec.snapshots.traffic import CANARY, SERVED, TrafficPlan, read_plan

if TYPE_CHECKING:  # the Redis and Kafka clients: imported only when the click join is on
    from streamrec.serving.clicks import ClickJoin

logger = logging.getLogger(__name__)

# Latencies kept per arm and window for the p99: the latest 10,000 requests (80 KB), the busier
# arm's in a window the other fills slowly (a 1% canary).
LATENCY_WINDOW = 10_000


class ArmWindow:
    """One arm's figures: requests and errors since the plan began, latencies of this window."""

    def __init__(self) -> None:
        self.requests = 0
        self.errors = 0
        self.latencies: deque[float] = deque(maxlen=LATENCY_WINDOW)

    @property
    def error_rate(self) -> float:
        """Errors per request (0 with none)."""
        return self.errors / self.requests if self.requests else 0.0

    def p99(self) -> float:
        """The 99th percentile of the latencies kept, in seconds."""
        return p99(self.latencies)


def p99(latencies: Iterable[float]) -> float:
    """The 99th percentile of ``latencies``, in seconds (0 with none)."""
    values = np.fromiter(latencies, float)
    return float(np.percentile(values, 99)) if values.size else 0.0


def latency_verdict(
    canary: Iterable[float], served: Iterable[float], ratio: float, slack: float
) -> str | None:
    """Why the canary's latencies of one window are too slow against the served arm's, or None.

    Too slow: the canary's p99 above the served one's times ``ratio`` plus ``slack`` (seconds).
    """
    canary_p99, served_p99 = p99(canary), p99(served)
    limit = served_p99 * ratio + slack
    if canary_p99 <= limit:
        return None
    return (
        f"p99 latency {canary_p99:.4f}s above {limit:.4f}s "
        f"(the served version's {served_p99:.4f}s x {ratio} + {slack}s)"
    )


class CanaryGuard:
    """Judges the running canary by this instance's requests; ends it when it falls behind."""

    def __init__(self, router: Router, cfg: ServingConfig, clicks: ClickJoin | None = None) -> None:
        """Judge the canaries ``router`` routes by, with ``cfg``'s margins.

        And by click-through from ``clicks``, every instance's together, when
        ``canary_ctr_margin`` is set.
        """
        self.router = router
        self.cfg = cfg
        self.clicks = clicks
        self._plan: TrafficPlan | None = None
        self._arms: dict[str, ArmWindow] = {}
        self._slow: list[str] = []  # why each window running was too slow (`latency_verdict`)
        self.instance = f"{socket.gethostname()}:{os.getpid()}"

    def observe(self, plan: TrafficPlan | None, arm: str, ok: bool, seconds: float) -> None:
        """One request of ``arm`` under ``plan`` answered (``ok``) or failed, in ``seconds``."""
        if plan is None or plan.kind != "canary":
            return
        if plan is not self._plan:  # a new plan: judge it by its own requests
            self._plan, self._arms, self._slow = plan, {}, []
        window = self._arms.setdefault(arm, ArmWindow())
        window.requests += 1
        window.errors += not ok
        window.latencies.append(seconds)
        canary, served = self._arms.get(CANARY), self._arms.get(SERVED)
        if canary is not None and served is not None:
            if min(len(canary.latencies), len(served.latencies)) >= self.cfg.canary_min_requests:
                self._close_window(canary, served)

    def _close_window(self, canary: ArmWindow, served: ArmWindow) -> None:
        """Judge the window both arms filled, then open the next: a window within the limit resets."""
        ratio, slack = self.cfg.canary_latency_ratio, self.cfg.canary_latency_slack_s
        why = latency_verdict(canary.latencies, served.latencies, ratio, slack)
        if why is None:
            self._slow = []
        else:
            counts = f"over {len(canary.latencies)} canary and {len(served.latencies)} served requests"
            self._slow.append(f"{why} {counts}")
        canary.latencies.clear()
        served.latencies.clear()

    def verdict(self) -> str | None:
        """Why the canary falls behind, or None (also while too few requests were seen)."""
        canary, served = self._arms.get(CANARY), self._arms.get(SERVED)
        least = self.cfg.canary_min_requests
        if canary is None or served is None or min(canary.requests, served.requests) < least:
            return None
        figures = f"over {canary.requests} canary and {served.requests} served requests"
        if canary.error_rate > served.error_rate + self.cfg.canary_error_margin:
            return (
                f"error rate {canary.error_rate:.4f} above the served version's {served.error_rate:.4f} "
                f"by more than {self.cfg.canary_error_margin} {figures}"
            )
        windows = len(self._slow)
        if windows < self.cfg.canary_latency_windows:
            return None
        return f"{self._slow[-1]} (the last of {windows} windows running, each too slow)"

    def check_loading(self) -> TrafficPlan | None:
        """End the canary in the plan file if this instance cannot load it; the plan ended, if any.

        It reads the plan file: run it off the event loop.
        """
        problem = self.router.plan_problem
        if not self.cfg.canary_auto_rollback or problem is None:
            return None
        try:
            pending = read_plan(self.router.root)
        except SnapshotError:
            return None  # an unreadable plan is routed as before; the router logs it
        if pending is None or pending.kind != "canary":
            return None
        return self.end(pending, f"cannot load it: {problem}")

    def check_clicks(self) -> TrafficPlan | None:
        """End the running canary if its click-through falls behind; the plan ended, if any.

        By `click_verdict` on every instance's settled lists (clicked, or served
        ``click_window_s`` ago) and their clicks. It reads Redis: run it off the event loop.
        """
        plan, margin = self.router.plan, self.cfg.canary_ctr_margin
        if not self.cfg.canary_auto_rollback or margin is None or self.clicks is None or plan is None:
            return None
        if plan.kind != "canary":
            return None
        by_arm: dict[str, tuple[int, int]] = {}
        for (arm, _), figures in self.clicks.figures(plan).items():
            settled, clicked = by_arm.get(arm, (0, 0))
            by_arm[arm] = (settled + figures.settled, clicked + figures.clicks)
        reason = click_verdict(by_arm, margin, self.cfg.canary_min_lists)
        return None if reason is None else self.end(plan, reason)

    def judged(self) -> tuple[TrafficPlan, str] | None:
        """The canary to end and why, by its figures (run it on the event loop, which counts them)."""
        if not self.cfg.canary_auto_rollback or self._plan is None:
            return None
        reason = self.verdict()
        return None if reason is None else (self._plan, reason)

    def end(self, plan: TrafficPlan, why: str) -> TrafficPlan | None:
        """End ``plan`` if it is still in force (under the pointer's lock: off the event loop)."""
        arm = plan.arm(CANARY)
        name = version_name(arm.version) if arm is not None and arm.version is not None else "?"
        reason = f"auto-rollback of canary {name} by {self.instance}: {why}"
        ended = end_plan(self.router.scorer.store, reason, expected=plan)
        if ended is not None:
            logger.warning("canary ended reason=%s", reason)
        if self._plan is plan:
            self._plan, self._arms, self._slow = None, {}, []
        return ended


def click_verdict(by_arm: dict[str, tuple[int, int]], margin: float, least: int) -> str | None:
    """Why the canary's click-through falls behind, or None (also while too few lists settled).

    ``by_arm``: arm -> (settled lists, clicks). Judged once both arms have ``least`` settled
    lists: the canary's clicks per settled list below the served arm's by more than ``margin``.
    """
    canary, served = by_arm.get(CANARY, (0, 0)), by_arm.get(SERVED, (0, 0))
    if min(canary[0], served[0]) < least:
        return None
    canary_ctr, served_ctr = canary[1] / canary[0], served[1] / served[0]
    if canary_ctr >= served_ctr - margin:
        return None
    return (
        f"click-through {canary_ctr:.4f} below the served version's {served_ctr:.4f} by more than "
        f"{margin} over {canary[0]} canary and {served[0]} served settled lists (all instances)"
    )


async def follow_traffic(router: Router, guard: CanaryGuard, poll_s: float) -> None:
    """Take each new traffic plan and judge the canary, off the event loop, every ``poll_s``."""
    while True:
        await asyncio.sleep(poll_s)
        try:
            await asyncio.to_thread(router.refresh)
            ended = await asyncio.to_thread(guard.check_loading)
            ended = await asyncio.to_thread(guard.check_clicks) or ended
            judged = guard.judged()
            if judged is not None:
                ended = await asyncio.to_thread(guard.end, *judged) or ended
            if ended is not None:
                await asyncio.to_thread(router.refresh)
        except Exception:  # never let the watcher die: the service keeps the routing it has
            logger.exception("traffic plan check failed")
