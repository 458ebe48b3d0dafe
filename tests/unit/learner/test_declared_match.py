"""Match features of declared behaviour features (``streamrec.learner.model.MatchArch``, `matched`).

A declared ``id`` matches as the built-ins do (the share and count of the history on the
target's id); an ``ids`` value counts each behaviour by the fraction of the target's ids it
holds. Outcomes and numbers get none; the default schema's model is unchanged (its seeded
state and scores: ``test_keyed_digest.py``).
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from streamrec.config import ModelConfig
from streamrec.features import FeatureSchema, FeatureSpec
from streamrec.learner.columns import SampleColumns
from streamrec.learner.hashing import PADDING_BUCKET
from streamrec.learner.model import MatchArch
from streamrec.samples import Sample
from tests.support import small_tables

SCHEMA = FeatureSchema.of([
    FeatureSpec(name="genres", kind="ids", max_ids=3),
    FeatureSpec(name="shop"),
    FeatureSpec(name="year", kind="number", transform="standardize"),
    FeatureSpec(name="price", kind="number", transform="bucket", boundaries=(1.0, 10.0)),
    FeatureSpec(name="rating", kind="number", outcome=True),
    FeatureSpec(name="brand_seen", outcome=True),
    FeatureSpec(name="device", role="context"),
])
CFG = ModelConfig.model_validate({
    "tables": small_tables(256, 64, dim=4, ids="hashed"), "sequence_length": 4, "attention_units": (4,),
    "mlp_units": (4,), "device": "cpu",
})


def _overlap(target: list[list[int]], sequence: list[list[list[int]]], mask: list[list[int]]) -> np.ndarray:
    arch = MatchArch([PADDING_BUCKET], 1.0, pooled=[True])
    t = paddle.to_tensor(np.array(target, dtype=np.int64))
    s = paddle.to_tensor(np.array(sequence, dtype=np.int64))
    return arch.features([t], [s], paddle.to_tensor(np.array(mask, dtype=np.float32))).numpy()


def test_ids_count_each_behaviour_by_the_fraction_of_the_targets_ids_it_holds() -> None:
    got = _overlap(
        [[1, 2, 0], [1, 0, 0], [0, 0, 0], [3, 3, 0]],
        [
            [[1, 3, 0], [2, 1, 0], [4, 5, 0], [1, 2, 0]],  # 1/2, 2/2, 0; the last is padding
            [[1, 2, 0], [1, 0, 0], [0, 0, 0], [0, 0, 0]],  # 1, 1
            [[0, 0, 0], [1, 0, 0], [0, 0, 0], [0, 0, 0]],  # a target without ids matches nothing
            [[3, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]],  # a repeated id is still held in full
        ],
        [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0]],
    )
    want = np.array([
        [1.5 / 3, np.log1p(1.5)],
        [2 / 2, np.log1p(2)],
        [0.0, 0.0],
        [1.0, np.log1p(1)],
    ])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_ids_of_one_id_match_as_an_id_does() -> None:
    """With one id a value the overlap is the built-ins' "same row" count."""
    targets, sequences = [[5], [7], [0]], [[[5], [6], [5]], [[0], [7], [7]], [[0], [0], [0]]]
    mask = [[1, 1, 1], [1, 1, 1], [0, 0, 0]]
    as_id = MatchArch([PADDING_BUCKET], 1.0).features(
        [paddle.to_tensor(np.array(targets, dtype=np.int64)[:, 0])],
        [paddle.to_tensor(np.array(sequences, dtype=np.int64)[..., 0])],
        paddle.to_tensor(np.array(mask, dtype=np.float32)),
    )
    np.testing.assert_allclose(_overlap(targets, sequences, mask), as_id.numpy(), atol=1e-7)


@pytest.mark.parametrize("learner", ["din", "deepfm"])
def test_declared_ids_and_id_behaviour_features_are_matched_outcomes_and_numbers_not(learner: str) -> None:
    from streamrec.learner.registry import make_learner

    cfg = CFG.model_copy(update={"learner": learner})
    model = make_learner(cfg, schema=SCHEMA).model  # type: ignore[attr-defined]  # a TableLearner
    assert [model.x_query[i].name for i in model.matched] == ["item", "category", "genres", "shop"]
    assert model.match.pooled == [False, False, True, False]
    assert model.match.weight.shape == [8]
    default = make_learner(cfg).model  # type: ignore[attr-defined]  # a TableLearner
    assert [model.x_query[i].name for i in default.matched] == ["item", "category"]
    assert default.match.weight.shape == [4]


def _sample(k: int, genres: tuple[str, ...], history: tuple[tuple[str, ...], ...]) -> Sample:
    seq = tuple(f"h{k}-{j}" for j in range(len(history)))
    return Sample(
        f"s{k}", f"u{k // 3}", 1_000 + k, f"i{k}", "c", 0, seq, ("c",) * len(seq),
        features={"genres": genres}, seq_features={"genres": tuple(history)},
    )


def test_an_untrained_din_ranks_by_the_genre_match_at_once() -> None:
    """The genre share starts at ``match_init`` as the built-ins' shares do: before any training,
    within each user, the target sharing more of its genres with the history scores higher
    (items and categories say nothing here: every target is new, every category alike).
    """
    from streamrec.learner.din import DINLearner

    history = (("a", "b"), ("a",), ("c",))
    targets = [("a",), ("a", "c"), ("d",), ("b",), ("b", "d"), ("e",)]
    batch = SampleColumns.from_samples(
        [_sample(k, g, history) for k, g in enumerate(targets)]
    )
    scores = DINLearner(CFG, schema=SCHEMA).predict_many(batch)
    assert scores[0] > scores[1] > scores[2]
    assert scores[3] > scores[4] > scores[5]
