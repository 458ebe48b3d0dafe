"""The second model through the whole path: STREAMREC_MODEL__LEARNER=deepfm learns from the real
broker, snapshots as deepfm, is exported, promoted by the gate and served by the same scorer as DIN.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from streamrec.datasets import read_events
from streamrec.learner.columns import SampleColumns
from streamrec.pipeline import run_pipeline
from streamrec.samples import Sample
from streamrec.serving.export import learner_from_snapshot
from streamrec.serving.scorer import Candidate, Scorer
from streamrec.snapshots.store import SnapshotStore
from tests.support import small_tables


def test_deepfm_learns_from_the_broker_and_the_gate_promotes_what_serving_scores(
    pipeline_config, movielens_path: Path
) -> None:
    events = read_events(movielens_path, limit=6_000)
    cfg = pipeline_config(
        model={"learner": "deepfm", "tables": small_tables(2**12, dim=8), "sequence_length": 10},
        # A snapshot every second micro-batch, each judged by the next; the gate's margins
        # wide, so that it promotes: what is tested is that it can judge a DeepFM at all.
        learner={"max_batch_samples": 1000, "snapshot_every": 2, "min_eval_samples": 100,
                 "gate_auc_margin": 1.0, "gate_logloss_ratio": 100.0},
    )
    result = run_pipeline(cfg, events)

    store = SnapshotStore(cfg.learner.snapshot_dir)
    assert result.served is not None and result.served > 1
    assert all(store.manifest(v).learner == "deepfm" for v in store.versions())
    gated = [e for e in store.history() if e.reason.startswith("gate:")]
    assert gated, [e.reason for e in store.history()]  # the gate scored a served DeepFM export

    scorer = Scorer(cfg.learner.snapshot_dir)
    assert scorer.version == result.served
    assert scorer.model.contract["model"]["learner"] == "deepfm"
    kind, learner = learner_from_snapshot(store, result.served)
    assert kind == "deepfm"
    history = [(e.item_id, e.category_id) for e in events[:5]]
    candidates = [Candidate(e.item_id, e.category_id) for e in events[5:12]]
    served = scorer.model.score("u-new", history, candidates)
    batch = SampleColumns.from_samples([
        Sample(f"s{k}", "u-new", 1, c.item_id, c.category_id or "", 0,
               tuple(i for i, _ in history), tuple(c for _, c in history))
        for k, c in enumerate(candidates)
    ])
    np.testing.assert_allclose(served, learner.predict_many(batch), atol=1e-5)
