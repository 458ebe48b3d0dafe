"""The click attribution window, on the real Redis with a clock the test moves: a served list
counts toward its arm's click-through (lists and clicks) once its window has passed or it got
its click, never twice, and a click after the window still counts on a list already settled.
"""

from __future__ import annotations

import redis

from streamrec.serving.clicks import ArmClicks, ClickJoin
from streamrec.snapshots.traffic import Arm, TrafficPlan

PLAN = TrafficPlan("ab", "exp", (Arm("a", 1, 5000), Arm("b", 2, 5000)))


class Clock:
    """Seconds the test sets."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def join(client: redis.Redis, clock: Clock, window_s: float = 60.0) -> ClickJoin:
    return ClickJoin(
        lambda: client, "t:ab", ttl_s=3600, click_actions=("click",), window_s=window_s, clock=clock
    )


def click(request_id: str, item: str = "i1") -> dict[str, object]:
    return {"request_id": request_id, "item_id": item, "action": "click"}


def test_a_list_counts_once_its_window_passed_or_it_was_clicked(redis_client: redis.Redis) -> None:
    clock = Clock()
    j = join(redis_client, clock)
    for n in range(6):  # r0-r2 on arm a, r3-r5 on arm b, at t=1000
        j.served(PLAN, f"r{n}", "a" if n < 3 else "b", 1 if n < 3 else 2)
    clock.now += 10
    assert j.clicked(click("r0")) and j.clicked(click("r0", "i2")) and j.clicked(click("r3"))
    assert j.clicked(click("r0"))  # redelivered: joined, not counted again
    figures = j.figures(PLAN)
    # every list served, only the clicked ones settled, and all their clicks
    assert figures[("a", "v000001")] == ArmClicks(lists=3, settled=1, clicks=2)
    assert figures[("b", "v000002")] == ArmClicks(lists=3, settled=1, clicks=1)
    clock.now = 1_000 + 59.9  # within the window: as before
    assert j.figures(PLAN)[("a", "v000001")] == ArmClicks(3, 1, 2)
    clock.now = 1_000 + 60  # the window passed: the unclicked ones count, the clicked ones stay once
    assert j.figures(PLAN) == {("a", "v000001"): ArmClicks(3, 3, 2), ("b", "v000002"): ArmClicks(3, 3, 1)}
    clock.now += 100  # a late click counts on its list, settled already
    assert j.clicked(click("r4"))
    assert j.figures(PLAN)[("b", "v000002")] == ArmClicks(3, 3, 2)


def test_lists_settle_in_order_of_serving_in_bounded_steps(redis_client: redis.Redis) -> None:
    clock = Clock()
    j = join(redis_client, clock, window_s=30.0)
    j.settle_step = 7  # lists settled per script run: several runs for 25
    for n in range(25):
        clock.now = 1_000.0 + n
        j.served(PLAN, f"r{n}", "a", 1)
    clock.now = 1_000.0 + 30 + 9.5  # r0-r9 served 30 s ago or more
    assert j.figures(PLAN)[("a", "v000001")] == ArmClicks(25, 10, 0)
    clock.now += 100
    assert j.figures(PLAN)[("a", "v000001")] == ArmClicks(25, 25, 0)
    assert redis_client.exists("t:ab:{exp}:pending") == 0  # nothing left waiting


def test_without_a_window_a_list_counts_when_served(redis_client: redis.Redis) -> None:
    clock = Clock()
    j = join(redis_client, clock, window_s=0.0)
    j.served(PLAN, "r1", "b", 2)
    assert j.figures(PLAN) == {("b", "v000002"): ArmClicks(1, 1, 0)}


def test_a_request_id_served_again_counts_as_one_list(redis_client: redis.Redis) -> None:
    """A client's retry (the same ``request_id``) is one list shown: counted and settled once."""
    clock = Clock()
    j = join(redis_client, clock)
    j.served(PLAN, "r1", "a", 1)
    clock.now += 1
    j.served(PLAN, "r1", "a", 1)  # the retry
    j.served(PLAN, "r1", "b", 2)  # a reused id, answered by the other arm: still the first list
    assert j.figures(PLAN)[("a", "v000001")] == ArmClicks(1, 0, 0)
    assert ("b", "v000002") not in j.figures(PLAN)
    assert j.clicked(click("r1"))  # the click goes to the arm that first served it
    clock.now += 100
    assert j.figures(PLAN) == {("a", "v000001"): ArmClicks(1, 1, 1)}


def test_a_list_is_recorded_after_redis_lost_the_script(redis_client: redis.Redis) -> None:
    """A restarted or flushed server has no scripts: recording loads its script again."""
    clock = Clock()
    j = join(redis_client, clock, window_s=0.0)
    j.served(PLAN, "r1", "a", 1)
    redis_client.script_flush()
    j.served(PLAN, "r2", "a", 1)
    j.served(PLAN, "r2", "a", 1)
    assert j.figures(PLAN) == {("a", "v000001"): ArmClicks(2, 2, 0)}
