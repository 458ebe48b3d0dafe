"""The canary guard's judgement: by each arm's error rate, once both arms have answered the
configured minimum, and by their p99 latency in windows of that many requests, over the limit in
several windows running; only a canary is judged, and a new plan starts afresh.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from streamrec.config import ServingConfig
from streamrec.serving.guard import CanaryGuard, click_verdict, latency_verdict
from streamrec.snapshots.traffic import Arm, TrafficPlan

CANARY = TrafficPlan("canary", "c", (Arm("canary", 2, 1000), Arm("served", None, 9000)))


def guard(**settings: Any) -> CanaryGuard:
    return CanaryGuard(None, ServingConfig(canary_min_requests=100, **settings))  # type: ignore[arg-type]


def feed(
    g: CanaryGuard, arm: str, n: int, seconds: float = 0.001, errors: int = 0, plan: TrafficPlan = CANARY
) -> None:
    for k in range(n):
        g.observe(plan, arm, ok=k >= errors, seconds=seconds)


def test_nothing_is_judged_below_the_minimum_of_requests() -> None:
    g = guard()
    feed(g, "served", 1000)
    feed(g, "canary", 99, errors=99, seconds=5.0)
    assert g.verdict() is None
    feed(g, "canary", 1)
    assert g.verdict() is not None


def test_an_error_rate_past_the_margin_ends_the_canary() -> None:
    g = guard(canary_error_margin=0.01)
    feed(g, "served", 1000, errors=10)  # 1%
    feed(g, "canary", 100, errors=2)  # 2%: within 1% + 0.01
    assert g.verdict() is None
    feed(g, "canary", 100, errors=3)  # 2.5%
    reason = g.verdict()
    assert reason is not None and reason.startswith("error rate 0.0250 above the served version's 0.0100")
    assert "over 200 canary and 1000 served requests" in reason


def both(g: CanaryGuard, n: int, canary_s: float, served_s: float, plan: TrafficPlan = CANARY) -> None:
    """``n`` requests of each arm, interleaved as traffic is: one served, one canary."""
    for _ in range(n):
        g.observe(plan, "served", ok=True, seconds=served_s)
        g.observe(plan, "canary", ok=True, seconds=canary_s)


def test_latency_verdict_compares_one_windows_p99_with_ratio_and_slack() -> None:
    served = [0.01] * 1000
    assert latency_verdict([0.06] * 200, served, ratio=2.0, slack=0.05) is None  # under 0.01 x 2 + 0.05
    reason = latency_verdict([0.2] * 200, served, ratio=2.0, slack=0.05)
    assert reason == "p99 latency 0.2000s above 0.0700s (the served version's 0.0100s x 2.0 + 0.05s)"
    # a p99 of 200 requests is their third slowest: three stalled requests decide one window
    assert latency_verdict([0.001] * 197 + [0.4] * 3, served, ratio=2.0, slack=0.05) is not None
    assert latency_verdict([0.001] * 198 + [0.4] * 2, served, ratio=2.0, slack=0.05) is None


def test_a_p99_past_ratio_and_slack_in_windows_running_ends_the_canary() -> None:
    g = guard(canary_latency_ratio=2.0, canary_latency_slack_s=0.05, canary_latency_windows=3)
    both(g, 100, canary_s=0.06, served_s=0.01)  # a window under 0.01 x 2 + 0.05
    assert g.verdict() is None
    both(g, 200, canary_s=0.2, served_s=0.01)  # two windows over: not yet
    assert g.verdict() is None
    both(g, 99, canary_s=0.2, served_s=0.01)  # the third window not full
    assert g.verdict() is None
    both(g, 1, canary_s=0.2, served_s=0.01)
    reason = g.verdict()
    assert reason == (
        "p99 latency 0.2000s above 0.0700s (the served version's 0.0100s x 2.0 + 0.05s) "
        "over 100 canary and 100 served requests (the last of 3 windows running, each too slow)"
    )


def stalled_window(g: CanaryGuard) -> None:
    """A window of a canary as fast as the served version, with three of its requests caught in pauses."""
    both(g, 97, canary_s=0.002, served_s=0.002)
    both(g, 3, canary_s=0.4, served_s=0.002)


def test_pauses_that_slow_one_window_of_a_canary_as_fast_as_the_served_one_end_nothing() -> None:
    # What ended canaries of a model as fast as the served one: a p99 on a few hundred requests
    # rests on three, and pauses of the whole process land on either arm's requests.
    g = guard(canary_latency_ratio=2.0, canary_latency_slack_s=0.05)
    stalled_window(g)
    assert g.verdict() is None
    stalled_window(g)
    both(g, 100, canary_s=0.002, served_s=0.002)  # a window within the limit starts the count anew
    stalled_window(g)
    stalled_window(g)
    assert g.verdict() is None
    stalled_window(g)  # the third running
    assert g.verdict() is not None
    assert guard(canary_latency_windows=1).cfg.canary_latency_windows == 1
    with pytest.raises(ValidationError, match="canary_latency_windows"):
        ServingConfig(canary_latency_windows=0)


def test_a_window_closes_when_the_slower_arm_fills_it() -> None:
    # a 1% canary: the served arm answers many more in the window, judged all together
    g = guard(canary_latency_ratio=0.0, canary_latency_slack_s=0.0, canary_latency_windows=1)
    feed(g, "served", 5000, seconds=0.001)
    feed(g, "canary", 99, seconds=0.002)
    assert g.verdict() is None
    feed(g, "canary", 1, seconds=0.002)
    reason = g.verdict()
    assert reason is not None and "over 100 canary and 5000 served requests" in reason


def test_only_a_canary_is_judged_and_a_new_plan_starts_afresh() -> None:
    g = guard(canary_latency_ratio=0.0, canary_latency_slack_s=0.0, canary_latency_windows=2)
    ab = TrafficPlan("ab", "x", (Arm("canary", 2, 5000), Arm("served", 1, 5000)))
    both(g, 200, canary_s=0.001, served_s=0.001, plan=ab)
    assert g.verdict() is None and g.judged() is None
    both(g, 200, canary_s=0.002, served_s=0.001)
    assert g.judged() is not None
    again = TrafficPlan("canary", "c", (Arm("canary", 2, 2000), Arm("served", None, 8000)))
    both(g, 100, canary_s=0.002, served_s=0.001, plan=again)
    assert g.verdict() is None  # the grown canary's figures start at its own first request: one window
    both(g, 100, canary_s=0.002, served_s=0.001, plan=again)
    assert g.verdict() is not None
    assert guard(canary_auto_rollback=False, canary_latency_ratio=0.0).judged() is None


def test_click_through_is_judged_on_settled_lists_once_both_arms_have_the_minimum() -> None:
    # (settled lists, clicks): 40 settled canary lists are too few to judge by
    assert click_verdict({"canary": (40, 0), "served": (500, 50)}, margin=0.02, least=50) is None
    # 50 each: canary 0.0400 against 0.1000, past the margin of 0.02
    reason = click_verdict({"canary": (50, 2), "served": (500, 50)}, margin=0.02, least=50)
    assert reason == (
        "click-through 0.0400 below the served version's 0.1000 by more than 0.02 "
        "over 50 canary and 500 served settled lists (all instances)"
    )
    # within the margin, or better: no verdict
    assert click_verdict({"canary": (50, 4), "served": (500, 50)}, margin=0.02, least=50) is None
    assert click_verdict({"canary": (50, 9), "served": (500, 50)}, margin=0.02, least=50) is None
    assert click_verdict({"served": (500, 50)}, margin=0.0, least=1) is None  # no canary lists yet


def test_the_click_window_is_within_the_time_a_list_is_joinable() -> None:
    assert ServingConfig().click_window_s == 120.0
    with pytest.raises(ValidationError, match="click_window_s"):
        ServingConfig(click_window_s=100, click_ttl_s=60)
