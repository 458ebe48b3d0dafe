"""A rank's share of a mini-batch, the byte exchange's framing, and the group's micro-batch order.

The collectives themselves run across processes in ``tests/integration/learner/test_ranks.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from streamrec.config import StreamrecConfig
from streamrec.errors import ConfigError
from streamrec.learner.batch import EncodedBatch
from streamrec.learner.din import DINLearner
from streamrec.learner.ranked import RankedRunner, group_samples
from streamrec.learner.ranks import RankGroup, RankShare
from streamrec.samples import Sample


def encoded(n: int) -> EncodedBatch:
    return EncodedBatch(
        targets={"item": np.arange(1, n + 1)},
        sequences={"item": np.arange(1, 3 * n + 1).reshape(n, 3)},
        context={},
        label=np.ones(n, np.float32),
        dense=np.ones((n, 2), np.float32),
        extras={"rating/target": np.full(n, 2.5, np.float32)},
    )


def test_the_ranks_shares_are_contiguous_and_their_scales_make_the_mini_batch_mean() -> None:
    part = encoded(5)
    shares = [RankShare(rank, 2).share(part) for rank in range(2)]
    assert [s.targets["item"].tolist() for s, _ in shares] == [[1, 2, 3], [4, 5]]
    # DataParallel averages: (1/2) * sum(scale_r * mean_r) is the mean over the 5 samples
    assert [scale for _, scale in shares] == pytest.approx([6 / 5, 4 / 5])


def test_a_rank_left_without_samples_steps_on_padding_with_weight_zero() -> None:
    own, scale = RankShare(1, 2).share(encoded(1))
    assert scale == 0.0 and len(own) == 1
    arrays = [*own.targets.values(), *own.sequences.values(), own.label, own.dense, *own.extras.values()]
    assert all((a == 0).all() for a in arrays)


def test_one_rank_takes_the_whole_mini_batch_unscaled() -> None:
    own, scale = RankShare(0, 1).share(encoded(4))
    assert scale == 1.0 and own.targets["item"].tolist() == [1, 2, 3, 4]


def test_byte_strings_of_any_length_come_back_as_they_were() -> None:
    values = [b"", b"a", b"0123456789abcdef", bytes(range(256)), b"\x00\x00"]
    assert RankGroup(0, 1, 10.0).gather_bytes(values, "test") == [values]
    assert RankGroup(0, 1, 10.0).gather_bytes([], "test") == [[]]


def sample(n: int) -> bytes:
    return Sample(f"s{n}", "u", 1_700_000_000_000 + n, f"i{n}", "c", n % 2, (), ()).to_json()


def test_the_group_micro_batch_is_every_ranks_samples_by_partition_and_offset() -> None:
    places = [np.array([[2, 7], [0, 5]]), np.array([[1, 3], [0, 4], [3, 9]])]
    values = [[sample(1), sample(2)], [sample(3), b"not json", sample(5)]]
    samples, owned = group_samples(places, values, rank=1)
    # (0,4) is rank 1's invalid record: dead-lettered by rank 1, trained by none
    assert [s.sample_id for s in samples] == ["s2", "s3", "s1", "s5"]
    assert owned.tolist() == [False, True, False, True]


def test_several_ranks_refuse_online_ewc(tmp_path: object) -> None:
    cfg = StreamrecConfig.model_validate(
        {"model": {"ewc_lambda": 1.0}, "learner": {"snapshot_dir": tmp_path}}
    )
    group = RankGroup.__new__(RankGroup)
    group.rank, group.world = 0, 2
    with pytest.raises(ConfigError, match="EWC_LAMBDA=0"):
        RankedRunner(cfg, DINLearner(cfg.model), group)
