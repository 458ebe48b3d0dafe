"""Id statistics: what earlier micro-batches said about each target row and user."""

from __future__ import annotations

import math

import numpy as np

from streamrec.config import ModelConfig
from streamrec.learner.idstats import PRIOR_SAMPLES, IdStats
from tests.support import small_tables

CFG = ModelConfig.model_validate({"tables": small_tables(64, 16)})
ROWS = {t.name: t.rows for t in CFG.tables}


def logit(p: float) -> float:
    return math.log(p / (1 - p))


def test_rates_are_beta_smoothed_around_the_global_rate_and_users_are_centred() -> None:
    stats = IdStats(CFG, ROWS)
    assert stats.width == 6  # item, category, user: rate and count each
    targets = {"item": np.array([5, 5, 5, 7]), "category": np.array([1, 1, 1, 1])}
    users = np.array(["a", "a", "a", "b"])
    stats.count(targets, users, np.array([1.0, 1.0, 1.0, 0.0], np.float32))
    probe = {"item": np.array([5, 7, 9]), "category": np.array([1, 1, 2])}
    got = stats.features(probe, np.array(["a", "b", "c"]))
    prior, k = 0.75, PRIOR_SAMPLES
    np.testing.assert_allclose(
        got[:, 0], [logit((3 + k * prior) / (3 + k)), logit(k * prior / (1 + k)), logit(prior)], rtol=1e-5
    )
    np.testing.assert_allclose(got[:, 1], np.log1p([3, 1, 0]), rtol=1e-6)
    assert abs(got[2, 4]) < 1e-6  # an unseen user is the global rate: centred at zero
    assert got[0, 4] > 0 > got[1, 4] and got[0, 5] == np.float32(np.log1p(3))


def test_reset_rows_and_the_state_round_trip() -> None:
    stats = IdStats(CFG, ROWS)
    stats.count({"item": np.array([3]), "category": np.array([2])}, np.array(["u"]), np.ones(1, np.float32))
    restored = IdStats(CFG, ROWS)
    restored.load_state_arrays(stats.state_arrays("s/"), "s/")
    probe = ({"item": np.array([3]), "category": np.array([2])}, np.array(["u"]))
    np.testing.assert_array_equal(restored.features(*probe), stats.features(*probe))
    stats.reset("item", np.array([3]))
    assert stats.features(*probe)[0, 1] == 0.0  # the row forgot its count
