"""Serving reads each user's sequence from the real Redis feature store the consumers fill:
`POST /score` and `streamrec score` without a history score as with the stored one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

from streamrec.cli import app
from streamrec.config import RedisStoreConfig
from streamrec.events import Event
from streamrec.featurestore import RedisFeatureStore
from streamrec.featurestore.base import Arrival
from streamrec.serving.http import build_app, store_history
from streamrec.serving.scorer import Candidate, Scorer
from tests.support import trained_snapshots


@pytest.mark.parametrize("learner", ["din", "deepfm"])
def test_scores_read_the_users_sequence_from_redis(
    tmp_path: Path, store_config: RedisStoreConfig, learner: str
) -> None:
    snapshots = trained_snapshots(tmp_path / "snapshots", count=1, learner=learner)
    snapshots.promote(1)
    store = RedisFeatureStore(store_config, length=6, dedup_horizon_ms=86_400_000)
    store.attach(can_start_empty=True)
    behaviours = [("i1", "c1"), ("i2", "c2"), ("i4", "c4")]
    store.update([
        Arrival(Event(f"e{k}", "u7", item, category, "click", 1_000 + k), f"0:{k}")
        for k, (item, category) in enumerate(behaviours)
    ])
    history_of = store_history(store)
    assert history_of("u7") == behaviours
    scorer = Scorer(tmp_path / "snapshots")
    assert scorer.model.contract["model"]["learner"] == learner
    candidates = [Candidate("i1", "c1"), Candidate("i3", "c3"), Candidate("new", None)]
    want = scorer.model.score("u7", behaviours, candidates)
    assert not np.allclose(want, scorer.model.score("u7", [], candidates))  # the history matters
    with TestClient(build_app(scorer, history_of)) as client:
        response = client.post("/score", json={"user": "u7", "items": ["i1:c1", "i3:c3", "new"]})
        assert response.status_code == 200
        assert np.allclose(response.json()["scores"], want, atol=1e-6)
        unknown = client.post("/score", json={"user": "nobody", "items": ["i1:c1"]})
        assert unknown.status_code == 200  # an unknown user reads the default rows, no error

    result = CliRunner().invoke(
        app, ["score", "--user", "u7", "--items", "i1:c1,i3:c3,new", "--json",
              "--snapshot-dir", str(tmp_path / "snapshots")],
        env={"STREAMREC_STORE__URL": store_config.url, "STREAMREC_STORE__KEY_PREFIX": store_config.key_prefix,
             "STREAMREC_MODEL__SEQUENCE_LENGTH": "6"},
    )
    assert result.exit_code == 0, result.output
    doc = orjson.loads(result.stdout)
    assert doc["version"] == 1 and doc["history"] == 3
    assert np.allclose(doc["scores"], want, atol=1e-6)
