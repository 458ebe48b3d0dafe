"""The group's micro-batch order, a rank's share of a mini-batch, and the exchanges' framing.

The collectives themselves run across processes in ``tests/integration/learner/test_ranks.py``.
"""

from __future__ import annotations

import math
import os
import threading

import numpy as np
import pytest

from streamrec.config import ModelConfig, StreamrecConfig
from streamrec.errors import ConfigError, LearnerFailed
from streamrec.learner.base import TrainResult
from streamrec.learner.columns import EncodedColumns, SampleColumns
from streamrec.learner.din import DINLearner
from streamrec.learner.ranked import RankedRunner, group_step, settings_fingerprint
from streamrec.learner.ranks import GroupLayout, RankGroup, RankShare, batch_scheduled, pack, padding_only
from streamrec.learner.state import distinct_rows
from streamrec.samples import Sample
from tests.support import small_tables


def encoded(n: int) -> EncodedColumns:
    return EncodedColumns(
        targets={"item": np.arange(1, n + 1)},
        sequences={"item": np.arange(1, 3 * n + 1).reshape(n, 3)},
        context={},
        label=np.ones(n, np.float32),
        dense=np.ones((n, 2), np.float32),
        extras={"rating/target": np.full(n, 2.5, np.float32)},
    )


# rank 0 holds (partition 2, offset 7) and (0, 5); rank 1 (1, 3), (0, 4) and (3, 9): the group's
# micro-batch is (0,4) (0,5) (1,3) (2,7) (3,9)
PLACES = [np.array([[2, 7], [0, 5]]), np.array([[1, 3], [0, 4], [3, 9]])]


def test_each_rank_finds_its_samples_places_in_the_group_order_by_partition_and_offset() -> None:
    layouts = [GroupLayout.of(PLACES, rank) for rank in range(2)]
    assert [layout.total for layout in layouts] == [5, 5]
    assert layouts[0].mine.tolist() == [3, 1]
    assert layouts[1].mine.tolist() == [2, 0, 4]


def test_a_rank_trains_its_own_samples_of_a_mini_batch_scaled_to_the_mini_batch_mean() -> None:
    minibatch = np.array([4, 1, 0, 3])  # group positions, in the shuffle's order
    shares = [GroupLayout.of(PLACES, rank).share(minibatch, world=2) for rank in range(2)]
    assert [own.tolist() for own, _ in shares] == [[1, 0], [2, 1]]  # local indices, in that order
    # DataParallel averages: (1/2) * sum(scale_r * mean_r) is the mean over the 4 samples
    assert [scale for _, scale in shares] == pytest.approx([1.0, 1.0])
    own, scale = GroupLayout.of(PLACES, 1).share(np.array([1, 3]), world=2)
    assert own.tolist() == [] and scale == 0.0  # no sample of its own: a step of weight 0


def test_one_rank_holds_the_whole_micro_batch_unscaled() -> None:
    layout = GroupLayout.alone(4)
    own, scale = layout.share(np.array([2, 0, 3]), world=1)
    assert layout.total == 4 and own.tolist() == [2, 0, 3] and scale == 1.0


def test_a_padding_only_sample_reads_nothing() -> None:
    own = padding_only(encoded(2).take([0]))
    arrays = [*own.targets.values(), *own.sequences.values(), own.label, own.dense, *own.extras.values()]
    assert len(own) == 1 and all((a == 0).all() for a in arrays)


def test_an_exchange_concatenates_every_ranks_arrays_by_name_in_rank_order_in_one_gather() -> None:
    rank0 = {
        "keys": np.array([2**63 + 5], np.uint64), "label": np.array([1.0, 0.5]), "rows": np.zeros(0, np.int64)
    }
    mine = {"keys": np.array([7, 8], np.uint64), "label": np.array([0.25]), "rows": np.array([3], np.int64)}
    calls: list[str] = []

    def gather(array: np.ndarray, what: str) -> list[np.ndarray]:
        calls.append(what)
        return [pack(rank0), array]

    out = RankShare(1, 2, gather=gather).exchange(mine, "test")
    assert calls == ["test"]
    assert out["keys"].dtype == np.uint64 and out["keys"].tolist() == [2**63 + 5, 7, 8]
    assert out["label"].tolist() == [1.0, 0.5, 0.25]
    assert out["rows"].tolist() == [3]


def test_an_exchange_refuses_items_it_would_misread() -> None:
    with pytest.raises(ValueError, match="8-byte items: label"):
        pack({"rows": np.zeros(2, np.int64), "label": np.zeros(2, np.float32)})


def test_one_rank_exchanges_nothing() -> None:
    arrays = {"rows": np.array([1, 2])}
    assert RankShare(0, 1).exchange(arrays, "test")["rows"] is arrays["rows"]


def test_several_ranks_refuse_online_ewc(tmp_path: object) -> None:
    cfg = StreamrecConfig.model_validate(
        {"model": {"ewc_lambda": 1.0}, "learner": {"snapshot_dir": tmp_path}}
    )
    group = RankGroup.__new__(RankGroup)
    group.rank, group.world = 0, 2
    group._store = None  # built by hand: no TCP store to tell the others on as it leaves
    with pytest.raises(ConfigError, match="EWC_LAMBDA=0"):
        RankedRunner(cfg, DINLearner(cfg.model), group)


def test_a_rank_without_samples_of_its_own_steps_alike_on_padding_with_weight_zero() -> None:
    cfg = ModelConfig(tables=small_tables(2**8, 2**4, dim=4), sequence_length=4, mlp_units=[4])
    learner = DINLearner(cfg)
    before = learner.state_arrays()
    empty = SampleColumns.from_samples([])
    result = learner.learn_share(empty, GroupLayout(2 * cfg.train_batch_size + 1, np.zeros(0, np.int64)))
    assert result.steps == 3 and result.skipped_steps == 0  # the group's steps: its collectives
    assert math.isnan(result.loss)  # no loss of its own
    after = learner.state_arrays()
    for key in (k for k in before if k.startswith("model/")):  # weights, id maps, id statistics
        np.testing.assert_array_equal(after[key], before[key], err_msg=key)  # fresh moments: no step


def test_a_tables_distinct_rows_by_bitmap_are_np_uniques() -> None:
    rows = np.random.default_rng(3).integers(0, 500, 5_000)
    np.testing.assert_array_equal(distinct_rows(rows, 1_000), np.unique(rows))
    assert distinct_rows(np.zeros(0, np.int64), 10).tolist() == []


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux's scheduling policies")
def test_batch_scheduling_applies_to_the_threads_given_and_skips_those_gone() -> None:
    release = threading.Event()
    started = threading.Event()
    ids: list[int] = []

    def wait() -> None:
        ids.append(threading.get_native_id())
        started.set()
        release.wait(10)

    thread = threading.Thread(target=wait)
    thread.start()
    try:
        started.wait(10)
        assert batch_scheduled([ids[0], 2**22 + 12345]) == 1  # the second is no thread of ours
        assert os.sched_getscheduler(ids[0]) == os.SCHED_BATCH
        assert os.sched_getscheduler(threading.get_native_id()) == os.SCHED_OTHER
    finally:
        release.set()
        thread.join()


def test_the_ranks_settings_fingerprint_covers_the_samples_topic_but_not_the_device() -> None:
    """Noted by a tour: hosts given different samples topics were not compared as they start,
    though partition ``p`` of the topic is rank ``p % N``'s and a snapshot's positions are the
    group's: each host would read and record another topic's offsets.
    """
    cfg = StreamrecConfig.model_validate({"model": {"tables": small_tables()}})
    other_topic = cfg.model_copy(update={"kafka": cfg.kafka.model_copy(update={"samples_topic": "other"})})
    other_device = cfg.model_copy(update={"model": cfg.model.model_copy(update={"device": "cpu"})})
    other_model = cfg.model_copy(update={"model": cfg.model.model_copy(update={"wide": not cfg.model.wide})})
    same = settings_fingerprint(cfg)
    assert settings_fingerprint(other_device) == same
    assert settings_fingerprint(other_topic) != same
    assert settings_fingerprint(other_model) != same


def test_a_standardized_numbers_first_moments_are_the_groups() -> None:
    """Every rank gives a feature without moments the group's values before training on them."""
    from streamrec.features import FeatureSchema, FeatureSpec
    from streamrec.samples import Sample
    from tests.unit.learner.test_features import featured

    year = FeatureSpec(name="year", kind="number", transform="standardize")
    cfg = ModelConfig(tables=small_tables(2**8, 2**4, dim=4), sequence_length=4, mlp_units=[4])
    learner = DINLearner(cfg, schema=FeatureSchema.of([year]))
    calls: list[str] = []

    def gather(array: np.ndarray, what: str) -> list[np.ndarray]:  # rank 0 holds what rank 1 does
        calls.append(what)
        return [array, array]

    learner._ranks = RankShare(1, 2, gather=gather)  # the exchanges alone: no gradient sum
    dated = SampleColumns.from_samples([
        Sample(s.sample_id, s.user_id, s.ts, s.item_id, s.category_id, s.label, s.seq_items, s.seq_categories,
               features={"year": 1990.0 + 2 * i})
        for i, s in enumerate(featured(8))
    ])
    learner.learn_share(dated, GroupLayout(16, np.arange(8, 16, dtype=np.int64)))
    n, mean, _ = learner.feature_moments["year"]
    assert (n, mean) == (16, 1997.0)  # both ranks' 8 years, once: not counted again after training
    assert calls.count("first moments") == 1
    learner.learn_share(dated, GroupLayout(16, np.arange(8, 16, dtype=np.int64)))
    assert learner.feature_moments["year"][0] == 32 and calls.count("first moments") == 1


class RaisingRankLearner(DINLearner):
    """A user's subclass of a table learner (ranks take no other) with a bug of its own."""

    def learn_share(self, batch: SampleColumns, layout: GroupLayout) -> TrainResult:
        raise ValueError("the user's own bug")


def test_a_ranks_learner_raising_in_its_own_code_is_named_with_its_frames() -> None:
    """Noted by the replay tour: ``learner run`` named a user's learner that raised, ``--workers``
    gave the raw traceback around it (`group_step`), the rank's frames first.
    """
    learner = RaisingRankLearner(ModelConfig(tables=small_tables()))
    batch = SampleColumns.from_samples(
        [Sample(f"s{k}", f"u{k}", 1_000 + k, f"i{k}", "c1", k % 2, ("i9",), ("c1",)) for k in range(6)]
    )
    said = (r"^learner tests.unit.learner.test_ranks:RaisingRankLearner: learn_share raised ValueError: "
            r"the user's own bug \(learner rank 1, micro-batch 3\)$")
    with pytest.raises(LearnerFailed, match=said) as err:
        group_step(learner, batch, GroupLayout.alone(len(batch)), "learner rank 1, micro-batch 3")
    assert "in learn_share" in err.value.frames and "ranked.py" not in err.value.frames
