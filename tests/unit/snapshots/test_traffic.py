"""Traffic plans: shares, stable arms by user hash, and how promote, rollback and prune treat a
running canary or A/B test.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from streamrec.errors import SnapshotError
from streamrec.snapshots.canary import end_plan, start_ab, start_canary
from streamrec.snapshots.store import SnapshotStore
from streamrec.snapshots.traffic import (
    Arm,
    TrafficPlan,
    format_share,
    parse_share,
    plan_path,
    read_plan,
    write_plan,
)
from tests.unit.snapshots.test_snapshot import write

USERS = [f"user-{n}" for n in range(100_000)]


def canary_plan(version: int, share: int, salt: str = "canary-v") -> TrafficPlan:
    return TrafficPlan("canary", salt, (Arm("canary", version, share), Arm("served", None, 10_000 - share)))


@pytest.mark.parametrize(
    ("text", "basis_points"),
    [
        ("5%", 500),
        ("5", 500),
        ("0.5%", 50),
        ("12.25%", 1225),
        (" 100% ", 10_000),
        ("0.01%", 1),
    ],
)
def test_shares_parse_to_basis_points(text: str, basis_points: int) -> None:
    assert parse_share(text) == basis_points
    assert format_share(basis_points) == f"{basis_points / 100:.2f}%"


@pytest.mark.parametrize("text", ["0%", "101%", "five", "5.001%", "-5%", ""])
def test_bad_shares_are_one_clear_line(text: str) -> None:
    with pytest.raises(SnapshotError, match="share") as caught:
        parse_share(text)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("text", ["5.001%", "0.0001%"])
def test_a_share_finer_than_a_basis_point_is_refused_as_such(text: str) -> None:
    # it is a percentage: the error said it was not one
    with pytest.raises(SnapshotError, match=r"more than two decimals: shares go in steps of 0\.01%"):
        parse_share(text)


def test_shares_must_sum_to_100_percent() -> None:
    with pytest.raises(SnapshotError, match=r"shares must sum to 100%, not 50.00% \+ 40.00% = 90.00%"):
        TrafficPlan("ab", "x", (Arm("a", 1, 5000), Arm("b", 2, 4000)))
    with pytest.raises(SnapshotError, match="arm names must differ"):
        TrafficPlan("ab", "x", (Arm("a", 1, 5000), Arm("a", 2, 5000)))


def test_a_user_always_sees_one_arm_and_shares_hold_over_many_users() -> None:
    plan = canary_plan(2, 500)
    arms = [plan.arm_of(u).name for u in USERS]
    assert arms == [plan.arm_of(u).name for u in USERS]  # stable
    assert arms == [TrafficPlan.from_json(plan.to_json()).arm_of(u).name for u in USERS]  # as serve reads it
    share = Counter(arms)["canary"] / len(USERS)
    assert 0.048 < share < 0.052  # 5% +- 4 standard deviations (0.07%)


def test_a_grown_canary_keeps_its_first_users() -> None:
    small, large = canary_plan(2, 500), canary_plan(2, 2000)
    first = {u for u in USERS if small.arm_of(u).name == "canary"}
    grown = {u for u in USERS if large.arm_of(u).name == "canary"}
    assert first < grown and 0.195 < len(grown) / len(USERS) < 0.205


def test_ab_arms_split_near_their_shares() -> None:
    plan = TrafficPlan("ab", "exp-1", (Arm("a", 1, 5000), Arm("b", 2, 3000), Arm("c", 3, 2000)))
    counts = Counter(plan.arm_of(u).name for u in USERS)
    assert {k: round(v / len(USERS), 2) for k, v in counts.items()} == {"a": 0.5, "b": 0.3, "c": 0.2}
    other = TrafficPlan("ab", "exp-2", plan.arms)
    moved = sum(plan.arm_of(u) != other.arm_of(u) for u in USERS[:10_000])
    assert moved > 3000  # a new experiment name deals users anew


def test_a_damaged_plan_is_one_clear_line(tmp_path: Path) -> None:
    plan_path(tmp_path).parent.mkdir(parents=True)
    plan_path(tmp_path).write_text('{"kind": "canary"}')
    with pytest.raises(SnapshotError, match="not a traffic plan.*snapshot canary --abort"):
        read_plan(tmp_path)


def three_promoted(tmp_path: Path) -> SnapshotStore:
    store = SnapshotStore(tmp_path)
    for _ in range(4):
        write(store)
    store.promote(1)
    return store


def test_a_canary_needs_an_export(tmp_path: Path) -> None:
    store = three_promoted(tmp_path)
    with pytest.raises(SnapshotError, match="v000002 has no export, so serving cannot load it"):
        start_canary(store, 2, 500)
    with pytest.raises(SnapshotError, match="is the served version"):
        start_canary(store, 1, 500)
    with pytest.raises(SnapshotError, match="more than 0% and less than 100%"):
        start_canary(store, 2, 10_000)
    with pytest.raises(SnapshotError, match="shares must sum to 100%"):
        start_ab(store, [Arm("a", 1, 5000), Arm("b", 2, 4000)])
    assert read_plan(tmp_path) is None and [e.action for e in store.history()] == ["promote"]


def run_plan(store: SnapshotStore, plan: TrafficPlan) -> None:
    """A plan as start_canary would leave it (these versions have no export to check)."""
    with store.serving.locked():
        current = store.current()
        assert current is not None
        store.serving.record(plan.kind, current, current, "test", traffic=plan.describe())
        write_plan(store.root, plan)


def test_promoting_the_canary_ends_it_and_serves_it(tmp_path: Path) -> None:
    store = three_promoted(tmp_path)
    run_plan(store, canary_plan(2, 500))
    with pytest.raises(SnapshotError, match="a canary runs .*promote one of its versions"):
        store.promote(3)
    store.promote(2)
    assert store.current() == 2 and read_plan(tmp_path) is None
    assert [e.action for e in store.history()] == ["promote", "canary", "promote", "end"]
    assert store.history()[-1].traffic == "canary canary=v000002:5.00% served=current:95.00%"
    assert store.serving.rollback_candidates(2) == [1]  # canary events do not move the stack


def test_rollback_during_a_canary_ends_it_and_keeps_the_served_version(tmp_path: Path) -> None:
    store = three_promoted(tmp_path)
    store.promote(2)
    run_plan(store, canary_plan(3, 500))
    assert store.rollback(reason="bad canary") == 2
    assert store.current() == 2 and read_plan(tmp_path) is None
    assert store.history()[-1].action == "end" and "bad canary" in store.history()[-1].reason
    assert store.rollback() == 1  # no plan now: the pointer moves back


def test_end_plan_with_an_expected_plan_lets_one_instance_decide(tmp_path: Path) -> None:
    store = three_promoted(tmp_path)
    plan = canary_plan(2, 500)
    run_plan(store, plan)
    assert end_plan(store, "auto-rollback", expected=plan) == plan
    assert end_plan(store, "auto-rollback", expected=plan) is None  # the second instance
    assert [e.action for e in store.history()].count("end") == 1
    with pytest.raises(SnapshotError, match="no canary or A/B test runs"):
        end_plan(store, "manual")


def test_prune_keeps_the_served_the_canary_and_the_previous_served(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    for _ in range(8):
        write(store)
    store.promote(2)
    store.promote(3)  # served; 2 the previous served
    run_plan(store, canary_plan(4, 500))
    deleted = store.prune(keep_last=1)
    assert set(store.versions()) == {2, 3, 4, 8}  # previous served, served, canary, newest
    assert set(deleted) == {1, 5, 6, 7}
    end_plan(store, "done")
    run_plan(store, TrafficPlan("ab", "e", (Arm("a", 3, 5000), Arm("b", 8, 5000))))
    assert store.prune(keep_last=1) == [4]  # 4 no longer a canary: only promoted ones stay


def test_ending_a_canary_leaves_an_ab_test_running_and_the_reverse(tmp_path: Path) -> None:
    """Noted by a tour: ``snapshot ab --end`` ended a running canary, and ``canary --abort`` an A/B
    test. A canary is a candidate on its way to promotion, an A/B test an experiment between
    fixed versions (docs/serving.md): the command for one never ends the other; rollback ends
    either.
    """
    store = three_promoted(tmp_path)
    canary = canary_plan(2, 500)
    run_plan(store, canary)
    with pytest.raises(SnapshotError) as caught:
        end_plan(store, "manual", kind="ab")
    assert str(caught.value) == (
        f"an A/B test does not run in {tmp_path}, a canary does ({canary.describe()}): left running; "
        "`streamrec snapshot canary --abort` (or `streamrec snapshot rollback`) ends it"
    )
    assert read_plan(tmp_path) == canary
    assert end_plan(store, "manual", kind="canary") == canary
    ab = TrafficPlan("ab", "exp", (Arm("a", 1, 5000), Arm("b", 2, 5000)))
    run_plan(store, ab)
    refused = "a canary does not run .* an A/B test does .*`streamrec snapshot ab --end`"
    with pytest.raises(SnapshotError, match=refused):
        end_plan(store, "manual", kind="canary")
    assert read_plan(tmp_path) == ab and store.history()[-1].action == "ab"
    assert end_plan(store, "manual", kind="ab") == ab
    assert read_plan(tmp_path) is None
