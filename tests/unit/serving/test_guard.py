"""The canary guard's judgement: by each arm's error rate and p99 latency, once both arms have
answered the configured minimum; only a canary is judged, and a new plan starts afresh.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from streamrec.config import ServingConfig
from streamrec.serving.guard import CanaryGuard, click_verdict
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


def test_a_p99_past_ratio_and_slack_ends_the_canary() -> None:
    g = guard(canary_latency_ratio=2.0, canary_latency_slack_s=0.05)
    feed(g, "served", 1000, seconds=0.01)
    feed(g, "canary", 200, seconds=0.06)  # under 0.01 x 2 + 0.05
    assert g.verdict() is None
    feed(g, "canary", 200, seconds=0.2)
    reason = g.verdict()
    assert reason is not None and reason.startswith("p99 latency 0.2000s above 0.0700s")


def test_only_a_canary_is_judged_and_a_new_plan_starts_afresh() -> None:
    g = guard(canary_latency_ratio=0.0, canary_latency_slack_s=0.0)
    ab = TrafficPlan("ab", "x", (Arm("canary", 2, 5000), Arm("served", 1, 5000)))
    feed(g, "served", 200, plan=ab)
    feed(g, "canary", 200, plan=ab)
    assert g.verdict() is None and g.judged() is None
    feed(g, "served", 200)
    feed(g, "canary", 200)
    assert g.judged() is not None
    again = TrafficPlan("canary", "c", (Arm("canary", 2, 2000), Arm("served", None, 8000)))
    feed(g, "canary", 1, plan=again)
    assert g.verdict() is None  # the grown canary's figures start at its own first request
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
