"""Tests for ``streamrec.learner.idmap``: admission, eviction, reuse, growth, bounds, state."""

from __future__ import annotations

import numpy as np
import pytest

from streamrec.config import TableConfig
from streamrec.learner.hashing import fingerprint
from streamrec.learner.idmap import DEFAULT_ROW, FIRST_ROW, IdMap

DAY_MS = 86_400_000


def table(**kw: object) -> TableConfig:
    fields = {
        "name": "item", "feature": "item", "rows": 64, "initial_rows": 8, "min_count": 2, "ttl_s": 86_400.0
    }
    return TableConfig.model_validate({**fields, **kw})


def keys(*ids: str) -> np.ndarray:
    return fingerprint(list(ids))


NONE = np.zeros(0, np.uint64)


def test_an_id_gets_its_own_row_after_min_count_sightings_across_micro_batches() -> None:
    m = IdMap(table())
    assert m.lookup(keys("a", "b")).tolist() == [DEFAULT_ROW, DEFAULT_ROW]
    first = m.observe(keys("a", "b", "b"), NONE, 0)
    assert first.admitted == 1 and m.lookup(keys("a")).tolist() == [DEFAULT_ROW]
    row_b = int(m.lookup(keys("b"))[0])
    assert row_b >= FIRST_ROW and first.rows.tolist() == [row_b]
    second = m.observe(keys("a"), NONE, 1)
    assert second.admitted == 1 and int(m.lookup(keys("a"))[0]) not in (DEFAULT_ROW, row_b)
    assert m.rows_in_use == 2 and second.in_use == 2


def test_distinct_ids_never_share_a_row() -> None:
    m = IdMap(table(rows=4096, initial_rows=4096, min_count=1))
    ids = [f"item-{i}" for i in range(3000)]
    m.observe(keys(*ids), NONE, 0)
    rows = m.lookup(keys(*ids))
    assert len(set(rows.tolist())) == 3000 and rows.min() >= FIRST_ROW


def test_ids_unseen_for_the_ttl_are_evicted_and_their_rows_reused() -> None:
    m = IdMap(table(min_count=1))
    m.observe(keys("old", "kept"), NONE, 0)
    row_old = int(m.lookup(keys("old"))[0])
    m.observe(NONE, keys("kept"), DAY_MS // 2)  # mentioned in a sequence: still alive
    done = m.observe(keys("new"), NONE, DAY_MS + 1)
    assert done.evicted == 1 and done.admitted == 1
    assert m.lookup(keys("old")).tolist() == [DEFAULT_ROW]
    assert m.lookup(keys("new")).tolist() == [row_old] and done.rows.tolist() == [row_old]
    assert m.lookup(keys("kept"))[0] >= FIRST_ROW


def test_candidates_expire_too_and_count_afresh() -> None:
    m = IdMap(table())
    m.observe(keys("a"), NONE, 0)
    m.observe(keys("a"), NONE, 2 * DAY_MS)  # the first sighting is too old to count
    assert m.lookup(keys("a")).tolist() == [DEFAULT_ROW]
    m.observe(keys("a"), NONE, 2 * DAY_MS + 1)
    assert m.lookup(keys("a"))[0] >= FIRST_ROW


def test_the_table_doubles_up_to_its_rows_then_gives_the_least_recent_ids_rows_to_new_ones() -> None:
    m = IdMap(table(rows=20, initial_rows=8, min_count=1, ttl_s=None))
    assert m.capacity == 8
    done = m.observe(keys(*(f"i{k}" for k in range(10))), NONE, 0)
    assert done.capacity == 16 and done.admitted == 10 and done.refused == 0
    m.observe(keys(*(f"i{k}" for k in range(5))), NONE, 1)  # i0..i4 seen again
    done = m.observe(keys(*(f"j{k}" for k in range(10))), NONE, 2)
    # 18 rows for ids: 10 i's + 8 free, so the 2 least recently seen i's make room.
    assert done.capacity == 20 and done.admitted == 10 and done.evicted == 2 and done.refused == 0
    assert m.rows_in_use == 18
    assert (m.lookup(keys(*(f"i{k}" for k in range(5)))) >= FIRST_ROW).all()
    assert (m.lookup(keys(*(f"i{k}" for k in range(5, 10)))) == DEFAULT_ROW).sum() == 2


def test_a_micro_batch_with_more_new_ids_than_rows_is_refused_the_excess() -> None:
    m = IdMap(table(rows=8, initial_rows=8, min_count=1, ttl_s=None))
    done = m.observe(keys(*(f"i{k}" for k in range(10))), NONE, 0)
    assert done.admitted == 6 and done.refused == 4 and done.evicted == 0  # its own ids stay
    later = m.observe(keys("late"), NONE, 1)  # the 4 refused are still due, "late" too
    assert later.admitted == 5 and later.evicted == 5 and later.refused == 0


def test_the_most_seen_candidates_win_scarce_rows() -> None:
    m = IdMap(table(rows=4, initial_rows=4, min_count=1))  # two rows for ids
    m.observe(keys("rare", "hot", "hot", "hot", "warm", "warm"), NONE, 0)
    assert m.lookup(keys("hot", "warm", "rare")).tolist()[2] == DEFAULT_ROW
    assert min(m.lookup(keys("hot", "warm")).tolist()) >= FIRST_ROW


def test_candidates_are_capped_at_the_tables_rows() -> None:
    m = IdMap(table(rows=16, initial_rows=16, min_count=5, ttl_s=None))
    for k in range(10):
        m.observe(keys(*(f"once-{k}-{i}" for i in range(10))), NONE, k)
    assert m.tracked == 16  # the most recently seen candidates
    # Slots are bounded by the most ids tracked at once: the cap and one micro-batch's new ids.
    assert len(m.rows) <= 16 + 10 and m.nbytes < (16 + 10) * 48


def test_state_round_trip_restores_the_same_future() -> None:
    m = IdMap(table(min_count=1))
    m.observe(keys(*(f"a{k}" for k in range(12))), NONE, 0)
    m.observe(keys("b1", "b2"), NONE, DAY_MS + 5)  # evicts the a's
    restored = IdMap(table(min_count=1))
    restored.load_state_arrays(m.state_arrays("x/"), "x/", m.capacity)
    probe = keys("a1", "b1", "b2", "zz")
    assert restored.lookup(probe).tolist() == m.lookup(probe).tolist()
    follow = keys(*(f"c{k}" for k in range(5)))
    again = restored.observe(follow, NONE, DAY_MS + 6)
    assert m.observe(follow, NONE, DAY_MS + 6).rows.tolist() == again.rows.tolist()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("keys", np.array([5, 5], np.uint64), "tracked twice"),
        ("rows", np.array([2, -3], np.int64), "outside"),
        ("rows", np.array([2, 99], np.int64), "outside"),
        ("rows", np.array([2, 2], np.int64), "owned twice"),
        ("counts", np.array([1], np.int64), "different lengths"),
    ],
)
def test_an_inconsistent_state_is_refused(field: str, value: np.ndarray, message: str) -> None:
    state = {
        "x/keys": np.array([3, 5], np.uint64), "x/rows": np.array([2, 3], np.int64),
        "x/counts": np.array([1, 1], np.int64), "x/last_seen": np.array([0, 0], np.int64),
    }
    with pytest.raises(ValueError, match=message):
        IdMap(table()).load_state_arrays({**state, f"x/{field}": value}, "x/", 8)


def test_a_free_slot_holding_an_id_is_refused() -> None:
    state = {
        "x/keys": np.array([3, 5], np.uint64), "x/rows": np.array([2, -2], np.int64),
        "x/counts": np.array([1, 1], np.int64), "x/last_seen": np.array([0, 0], np.int64),
    }
    with pytest.raises(ValueError, match="a free slot"):
        IdMap(table()).load_state_arrays(state, "x/", 8)


def test_a_forgotten_id_leaves_the_others_in_their_slots_and_a_new_one_takes_its_slot() -> None:
    m = IdMap(table(min_count=1))
    m.observe(keys("a", "b", "c"), NONE, 0)
    m.observe(keys("b", "c"), NONE, DAY_MS // 2)
    before = m.state_arrays("x/")
    m.observe(keys("d"), NONE, DAY_MS + 1)  # evicts a; d takes a's slot
    after = m.state_arrays("x/")
    assert len(after["x/keys"]) == 3 and m.tracked == 3
    changed = np.flatnonzero(after["x/keys"] != before["x/keys"]).tolist()
    assert changed == [int(np.flatnonzero(before["x/keys"] == keys("a")[0])[0])]
    assert after["x/keys"][changed[0]] == keys("d")[0]
    restored = IdMap(table(min_count=1))
    restored.load_state_arrays(after, "x/", m.capacity)
    assert restored.lookup(keys("a", "b", "c", "d")).tolist() == m.lookup(keys("a", "b", "c", "d")).tolist()
    key_order = m.owned()[0]
    assert (key_order[1:] > key_order[:-1]).all() and len(key_order) == 3


def _sorted_state(m: IdMap) -> dict[str, np.ndarray]:
    """``m``'s state with its slots compacted and sorted by key (as state layout 3 held it)."""
    state = m.state_arrays("x/")
    live = state["x/rows"] != -2
    order = np.argsort(state["x/keys"][live])
    return {k: v[live][order] for k, v in state.items()}


@pytest.mark.parametrize("seed", range(6))
def test_decisions_do_not_depend_on_the_slots(seed: int) -> None:
    """A map whose slots differ (here: compacted and sorted by key) admits, evicts and looks up alike."""
    rng = np.random.default_rng(seed)
    cfg = table(rows=32, initial_rows=8, min_count=int(rng.integers(1, 3)), ttl_s=60.0)
    universe = rng.integers(1, 2**64 - 1, 300, dtype=np.uint64)
    m, other, now = IdMap(cfg), IdMap(cfg), 0
    for step in range(40):
        now += int(rng.integers(0, 30_000))
        targets, mentioned = rng.choice(universe, int(rng.integers(0, 60))), rng.choice(universe, 20)
        if step % 5 == 2:
            fresh = IdMap(cfg)
            fresh.load_state_arrays(_sorted_state(other), "x/", other.capacity)
            other = fresh
        a, b = m.observe(targets, mentioned, now), other.observe(targets, mentioned, now)
        assert a.rows.tolist() == b.rows.tolist() and (a.evicted, a.refused) == (b.evicted, b.refused)
        assert m.lookup(universe).tolist() == other.lookup(universe).tolist()
    assert (m.rows == -2).any()  # the slots did differ from the compacted ones
    for k, v in _sorted_state(m).items():
        np.testing.assert_array_equal(v, _sorted_state(other)[k], err_msg=k)
