"""A micro-batch trained in parts (`TableLearner.learn_part`, then `end_micro_batch`).

One part is `learn_many` bit for bit; over several, online EWC's anchor and Fisher stay the
previous micro-batch's until the close, which consolidates every part's steps at once, even
across a table grown between parts.
"""

from __future__ import annotations

import numpy as np

from streamrec.config import ModelConfig
from streamrec.learner.base import PartLearner
from streamrec.learner.din import EWC_PREFIX, DINLearner
from tests.support import small_tables
from tests.unit.learner.test_din import CFG, _batch

EWC = CFG.model_copy(update={"ewc_lambda": 10.0, "ewc_normalise": False, "ewc_gamma": 0.5})
DENSE = "model.head.mlp.0.weight"


def _dense_ewc(learner: DINLearner) -> dict[str, np.ndarray]:
    """EWC's anchors and Fisher of the dense weights (a table's rows given to new ids restart)."""
    return {
        k: v for k, v in learner.state_arrays().items()
        if k.startswith(EWC_PREFIX) and "embedding." not in k and "wide." not in k
    }


def test_one_part_is_learn_many_bit_for_bit() -> None:
    whole, parts = DINLearner(EWC), DINLearner(EWC)
    assert isinstance(parts, PartLearner)
    for seed in (40, 41, 42):
        batch = _batch(150, seed)
        np.testing.assert_array_equal(whole.predict_many(batch), parts.predict_many(batch))
        expected = whole.learn_many(batch)
        assert parts.learn_part(batch) == expected
        parts.end_micro_batch()
    mine, theirs = parts.state_arrays(), whole.state_arrays()
    assert mine.keys() == theirs.keys()
    for key, array in theirs.items():
        np.testing.assert_array_equal(mine[key], array, err_msg=key)


def test_ewc_holds_its_anchor_across_parts_and_consolidates_every_part_at_the_close() -> None:
    learner = DINLearner(EWC)
    learner.learn_many(_batch(150, 43))  # the previous micro-batch: the anchor
    before = _dense_ewc(learner)
    ewc = learner._ewc
    assert ewc is not None
    first = learner.learn_part(_batch(100, 44))
    second = learner.learn_part(_batch(100, 45))
    assert first.penalty > 0 and second.penalty > 0  # both parts pulled towards the anchor
    for key, array in _dense_ewc(learner).items():  # neither anchor nor Fisher moved yet
        np.testing.assert_array_equal(array, before[key], err_msg=key)
    summed = ewc._batch[DENSE].numpy().copy()  # both parts' squared gradients
    steps = first.steps + second.steps
    learner.end_micro_batch()
    expected = 0.5 * before[f"{EWC_PREFIX}fisher/{DENSE}"] + summed / steps
    np.testing.assert_allclose(ewc.fisher[DENSE].numpy(), expected, rtol=1e-6)
    weights = dict(learner.train_module.named_parameters())[DENSE].numpy()
    np.testing.assert_array_equal(ewc.anchor[DENSE].numpy(), weights)


def test_a_table_grown_in_a_later_part_keeps_the_earlier_parts_fisher() -> None:
    cfg = ModelConfig.model_validate(
        {**EWC.model_dump(), "tables": small_tables(1024, 32, dim=8, initial_rows=16)}
    )
    learner = DINLearner(cfg)
    learner.learn_many(_batch(20, 46))
    learner.learn_part(_batch(20, 47))
    ewc = learner._ewc
    assert ewc is not None
    table = "model.embedding.tables.item.weight"
    touched = np.flatnonzero(ewc._touched[table])
    mass = ewc._batch[table].numpy()[touched].copy()
    dense = ewc._batch[DENSE].numpy().copy()
    rows = learner.rows["item"]
    learner.learn_part(_batch(300, 48))  # many new items: the table grows
    assert learner.rows["item"] > rows
    assert ewc is not learner._ewc  # rebuilt at the new rows, the micro-batch carried over
    carried = learner._ewc
    assert carried is not None
    assert carried._touched[table][touched].all()
    assert (carried._batch[table].numpy()[touched] >= mass).all()
    assert (carried._batch[DENSE].numpy() >= dense).all() and dense.any()
