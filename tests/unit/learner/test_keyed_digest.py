"""Seeded DIN and DeepFM give bit-identical scores and state across refactors of the batch.

Each learner is trained on fixed micro-batches of the bundled MovieLens samples (the default
schema, and one declaring genres, year and rating) and scores a held-out one; the SHA-256 of
its scores and of its whole state is compared with the value computed on main before the
learner's batch was keyed by feature name (commit 195788a, Paddle on x86-64 CPU). A change
that moves one bit of either fails here; one that means to (a new model input, a changed
initialisation) recomputes the digests on the commit before it and says so in its message.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from streamrec.config import ModelConfig, StreamrecConfig
from streamrec.datasets.sources import load_events
from streamrec.features import FeatureSchema, FeatureSpec
from streamrec.learner.batch import Batch
from streamrec.replay.batches import build_samples, by_count

pytest.importorskip("paddle")

MOVIELENS = (
    FeatureSpec(name="genres", kind="ids", max_ids=10),
    FeatureSpec(name="year", kind="number", transform="standardize"),
    FeatureSpec(name="rating", kind="number", outcome=True),
)
SCHEMAS = {"default": FeatureSchema.default(), "movielens": FeatureSchema.of(MOVIELENS)}

# Every built-in table kind: a dynamic item table, a hashed category table, a user table;
# id statistics, match features and the wide biases on (the defaults). The user table is
# "users": on 195788a one named "user" could not grow the item table (the users' statistics
# share its name; test_din_tables.py holds the fix).
CONFIG = {
    "tables": [
        {"name": "item", "feature": "item", "rows": 512, "dim": 4, "initial_rows": 64},
        {"name": "category", "feature": "category", "ids": "hashed", "rows": 64, "dim": 4},
        {"name": "users", "feature": "user", "ids": "hashed", "rows": 64, "dim": 4},
    ],
    "sequence_length": 8, "attention_units": (8,), "mlp_units": (8,), "device": "cpu",
    "train_batch_size": 64, "learning_rate": 0.01, "seed": 3,
}

# sha256 of (scores, state) per (learner, schema), computed on main at 195788a.
WANT = {
    ("din", "default"):
        "8b2acae502d4759b2891a0c73f187ba49df8935a19d08487655ec01b2cd66e86",
    ("din", "movielens"):
        "9b2b2918c117c62fcc2c6ec3a04b102092975087dcb5bef601e8d62ca475c183",
    ("deepfm", "default"):
        "35d694c575bea776913b6fb31abf6b8f0a91046eb51ab0ca6c118970878ea7b4",
    ("deepfm", "movielens"):
        "2a8fac6747b8c2d073a5c9e1343ffe8d8c058a46b0ec05439699e9c156d6aaf7",
}


def _batches(movielens: Path, schema: FeatureSchema) -> list[Batch]:
    settings = StreamrecConfig(features=schema.extras)
    events = load_events(movielens, limit=1_200, schema=schema)
    samples = build_samples(events, settings, schema)
    return [Batch.from_samples(b.samples) for b in by_count(samples, 400)]


def _digest(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for key in sorted(arrays):
        a = np.ascontiguousarray(arrays[key])
        h.update(f"{key}:{a.dtype.str}:{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def trained_digest(learner_name: str, schema_name: str, movielens: Path) -> str:
    """The digest of ``learner_name`` trained on all but the last micro-batch, scoring it."""
    from streamrec.learner.registry import make_learner

    schema = SCHEMAS[schema_name]
    batches = _batches(movielens, schema)
    learner = make_learner(ModelConfig.model_validate({**CONFIG, "learner": learner_name}), schema=schema)
    for batch in batches[:-1]:
        learner.learn_many(batch)
    scores = np.asarray(learner.predict_many(batches[-1]), dtype=np.float32)
    return _digest({"test/scores": scores, **learner.state_arrays()})


@pytest.mark.parametrize(("learner", "schema"), list(WANT), ids=lambda x: str(x))
def test_seeded_scores_and_state_are_bit_identical(learner: str, schema: str, movielens_path: Path) -> None:
    assert trained_digest(learner, schema, movielens_path) == WANT[(learner, schema)]
