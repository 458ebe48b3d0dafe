"""``DINLearner`` with dynamic tables: rows given and taken back, state reset on reuse,
growth without a restart, the id maps in snapshots, memory bounded on an endless stream.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from streamrec.config import ModelConfig
from streamrec.learner.columns import SampleColumns
from streamrec.learner.din import DINLearner
from streamrec.learner.idmap import DEFAULT_ROW
from streamrec.learner.snapshotting import group_state
from streamrec.samples import Sample
from streamrec.snapshots.store import SnapshotStore
from tests.support import small_tables

DAY_MS = 86_400_000
ITEM = "model.embedding.tables.item.weight"
WIDE = "model.wide.biases.item.weight"


def config(**table: object) -> ModelConfig:
    fields = {"min_count": 1, "initial_rows": 16, "ttl_s": 86_400.0, **table}
    return ModelConfig.model_validate({
        "tables": small_tables(256, 64, dim=4, **fields), "sequence_length": 5,
        "attention_units": (8,), "mlp_units": (8,), "train_batch_size": 16, "device": "cpu",
        "ewc_lambda": 1.0,
    })


def clicks(items: list[str], ts: int, user: str = "u") -> SampleColumns:
    """One sample per item, label alternating, each with the previous items as history."""
    samples = [
        Sample(f"{user}-{ts}-{k}", user, ts, item, f"c{k % 3}", k % 2, tuple(items[:k][-5:]), tuple(
            f"c{j % 3}" for j in range(max(0, k - 5), k)
        ))
        for k, item in enumerate(items)
    ]
    return SampleColumns.from_samples(samples)


def rows_of(learner: DINLearner, *items: str) -> list[int]:
    return learner.encode(clicks(list(items), 0)).targets["item"].tolist()


def test_new_ids_get_their_own_rows_the_others_share_the_default() -> None:
    learner = DINLearner(config(min_count=2))
    result = learner.learn_many(clicks(["a", "a", "b"], 0))
    assert result.ids_admitted["item"] == 1 and result.rows_in_use["item"] == 1
    a, b = rows_of(learner, "a", "b")
    assert a != DEFAULT_ROW and b == DEFAULT_ROW


def test_a_reused_row_starts_from_the_default_row_with_no_history() -> None:
    learner = DINLearner(config())
    learner.learn_many(clicks([f"old{k}" for k in range(8)] * 3, 0))  # trained rows with state
    old_rows = rows_of(learner, *(f"old{k}" for k in range(8)))
    result = learner.admit(clicks(["new"], DAY_MS + 1))["item"]  # the olds expire
    assert result.evicted == 8 and result.admitted == 1
    assert rows_of(learner, "old0", "new") == [DEFAULT_ROW, int(result.rows[0])]
    row = int(result.rows[0])
    assert row == min(old_rows)  # the lowest free row: deterministic, as after a restore
    state = learner.state_arrays()
    for name in (ITEM, WIDE):
        np.testing.assert_array_equal(state[f"model/{name}"][row], state[f"model/{name}"][DEFAULT_ROW])
        for slot in ("moment1", "moment2"):
            assert not state[f"optimizer/{name}/{slot}"][row].any()
        assert not state[f"ewc/fisher/{name}"][row].any()
        np.testing.assert_array_equal(state[f"ewc/anchor/{name}"][row], state[f"model/{name}"][row])
    assert state["model/stats/item/samples"][row] == 0 and state["state/known_items"][row] == 0


def test_tables_grow_without_a_restart_and_without_changing_a_score() -> None:
    learner = DINLearner(config())
    first = clicks([f"a{k}" for k in range(10)], 0)
    learner.learn_many(first)
    probe = clicks([f"a{k}" for k in range(10)] + ["unseen"], 0)
    before = learner.predict_many(probe)
    assert learner.rows["item"] == 16
    done = learner.admit(clicks([f"b{k}" for k in range(40)], 1))["item"]  # 50 ids: 16 -> 64
    assert done.capacity == 64 and learner.rows["item"] == 64
    assert learner.state_arrays()[f"model/{ITEM}"].shape == (64, 4)
    np.testing.assert_array_equal(learner.predict_many(probe), before)
    result = learner.learn_many(clicks([f"b{k}" for k in range(40)], 2))  # trains on the new rows
    assert result.steps > 0 and np.isfinite(result.loss)


def test_the_item_table_grows_beside_a_user_table_named_user() -> None:
    """The user statistics (``model/stats/user/*``, 2^20 buckets) are no table's rows, even
    with a table named ``user``: growing the item table once tried to cut them to its rows.
    """
    base = config().model_dump()
    tables = [*base["tables"], {"name": "user", "feature": "user", "ids": "hashed", "rows": 32, "dim": 4}]
    learner = DINLearner(ModelConfig.model_validate({**base, "tables": tables}))
    users = learner.state_arrays()["model/stats/user/samples"].shape
    learner.learn_many(clicks([f"b{k}" for k in range(40)], 1))  # 40 ids: 16 -> 64
    state = learner.state_arrays()
    assert learner.rows["item"] == 64 and state[f"model/{ITEM}"].shape == (64, 4)
    assert state["model/stats/user/samples"].shape == users
    assert state["model/model.embedding.tables.user.weight"].shape == (32, 4)


def test_a_grown_learner_round_trips_through_a_snapshot_into_a_fresh_one(tmp_path: Path) -> None:
    original = DINLearner(config())
    for k in range(3):
        original.learn_many(clicks([f"i{k}-{j}" for j in range(30)], k * 1000))
    store = SnapshotStore(tmp_path)
    store.write(group_state(original.state_arrays()), micro_batches=3, samples_trained=90, positions=())
    manifest, tensors = store.load(1)
    ids = {k.split("/")[-1] for k in tensors["model"] if k.startswith("ids/")}
    assert ids == {"keys", "rows", "counts", "last_seen"}
    restored = DINLearner(config())  # starts at 16 rows
    restored.load_state_arrays({f"{g}/{k}": v for g, a in tensors.items() for k, v in a.items()})
    assert restored.rows == original.rows and restored.rows["item"] > 16
    follow = clicks([f"i2-{j}" for j in range(10)] + [f"n{j}" for j in range(30)], 5000)
    assert original.learn_many(follow) == restored.learn_many(follow)
    probe = clicks([f"i0-{j}" for j in range(10)], 6000)
    np.testing.assert_array_equal(original.predict_many(probe), restored.predict_many(probe))


def test_state_from_a_table_too_large_for_this_configuration_is_refused() -> None:
    big = DINLearner(config())
    big.learn_many(clicks([f"x{k}" for k in range(100)], 0))
    arrays = st_load(st_save(big.state_arrays()))
    small = DINLearner(config(rows=64))
    try:
        small.load_state_arrays(arrays)
    except Exception as exc:  # noqa: BLE001 - the message is what is checked
        assert "has 128 rows" in str(exc) and "3..64" in str(exc)
    else:
        raise AssertionError("loaded a table larger than its configuration allows")


def test_memory_stays_bounded_on_an_endless_stream_of_new_ids() -> None:
    learner = DINLearner(config(rows=128, ttl_s=3_600.0))
    sizes = []
    for hour in range(30):
        batch = clicks([f"h{hour}-{k}" for k in range(60)], hour * 3_600_000 + 1)
        result = learner.learn_many(batch)
        assert result.rows_in_use["item"] <= 126
        sizes.append(sum(a.nbytes for a in learner.state_arrays().values()))
    assert learner.rows["item"] == 128  # grew to its cap, never past it
    assert max(sizes[10:]) == sizes[-1] or max(sizes[10:]) - min(sizes[10:]) < 0.05 * max(sizes)
    # The last two hours' ids are alive (seen within the hour before the newest batch).
    assert learner.learn_many(clicks(["z"], 31 * 3_600_000)).ids_evicted["item"] == 120
