"""Seeded DIN and DeepFM give the same scores and state across refactors of the model's inputs.

Each learner is trained on fixed micro-batches of the bundled MovieLens samples (the default
schema, and one declaring genres, year and rating) and scores a held-out one; its scores, and
per state array its shape and the sum of its absolute values, are compared with the reference
in ``keyed_reference.json``, computed on main before the learner's batch was keyed by feature
name (195788a); ``din/movielens`` since DIN's wide part covers the declared genres (state
layout 3), recomputed then (the other three cases unchanged by it); both ``movielens`` cases
recomputed again when a standardized number stopped being read raw before its moments (its
first micro-batch is trained on it standardized). On one machine the code
since gives the same arrays bit for bit (checked on
2026-12-03: every one of the 409 arrays of the four cases equal to 195788a's).

Bits are not compared: they depend on the processor and the BLAS kernels it gets (MKL's AVX2
and its generic path differ in the last bits, 7.5e-5 at most on a score here, 5e-4 relative on
an array's sum), and a digest recorded on one machine failed on another. The tolerances below
sit above that noise and far below what a changed input or initialisation moves. A change that
means to move the figures regenerates the reference on the commit before it and says so:

    .venv/bin/python -m tests.unit.learner.test_keyed_digest --write
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamrec.config import ModelConfig, StreamrecConfig
from streamrec.datasets.sources import load_events
from streamrec.features import FeatureSchema, FeatureSpec
from streamrec.learner.columns import SampleColumns
from streamrec.replay.batches import build_samples, by_count

pytest.importorskip("paddle")

MOVIELENS = (
    FeatureSpec(name="genres", kind="ids", max_ids=10),
    FeatureSpec(name="year", kind="number", transform="standardize"),
    FeatureSpec(name="rating", kind="number", outcome=True),
)
SCHEMAS = {"default": FeatureSchema.default(), "movielens": FeatureSchema.of(MOVIELENS)}
CASES = [(learner, schema) for learner in ("din", "deepfm") for schema in SCHEMAS]
REFERENCE = Path(__file__).with_name("keyed_reference.json")
SCORE_ATOL = 5e-4  # a probability
SUM_RTOL, SUM_ATOL = 5e-3, 1e-6

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


def _batches(movielens: Path, schema: FeatureSchema) -> list[SampleColumns]:
    settings = StreamrecConfig(features=schema.extras)
    events = load_events(movielens, limit=1_200, schema=schema)
    samples = build_samples(events, settings, schema)
    return [SampleColumns.from_samples(b.samples) for b in by_count(samples, 400)]


def trained(learner_name: str, schema_name: str, movielens: Path) -> dict[str, Any]:
    """``learner_name`` trained on all but the last micro-batch: its scores of that one, its state's sums."""
    from streamrec.learner.registry import make_learner

    schema = SCHEMAS[schema_name]
    batches = _batches(movielens, schema)
    learner = make_learner(ModelConfig.model_validate({**CONFIG, "learner": learner_name}), schema=schema)
    for batch in batches[:-1]:
        learner.learn_many(batch)
    scores = np.asarray(learner.predict_many(batches[-1]), dtype=np.float64)
    arrays = {
        name: [list(np.shape(a)), float(np.abs(np.asarray(a, dtype=np.float64)).sum())]
        for name, a in sorted(learner.state_arrays().items())
    }
    return {"scores": [float(f"{s:.8g}") for s in scores], "arrays": arrays}


def _dumps(doc: dict[str, dict[str, Any]]) -> str:
    """The reference as JSON, a case's scores on one line and one line an array."""
    cases = []
    for case, figures in sorted(doc.items()):
        arrays = figures["arrays"]
        lines = ",\n".join(f"   {json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(arrays.items()))
        cases.append(f' {json.dumps(case)}: {{\n  "scores": {json.dumps(figures["scores"])},\n'
                     f'  "arrays": {{\n{lines}\n  }}\n }}')
    return "{\n" + ",\n".join(cases) + "\n}\n"


@pytest.mark.parametrize(("learner", "schema"), CASES, ids=lambda x: str(x))
def test_seeded_scores_and_state_are_unchanged(learner: str, schema: str, movielens_path: Path) -> None:
    want = json.loads(REFERENCE.read_text())[f"{learner}/{schema}"]
    got = trained(learner, schema, movielens_path)
    np.testing.assert_allclose(got["scores"], want["scores"], rtol=0, atol=SCORE_ATOL)
    assert sorted(got["arrays"]) == sorted(want["arrays"])
    for name, (shape, total) in want["arrays"].items():
        got_shape, got_total = got["arrays"][name]
        assert got_shape == shape, name
        assert got_total == pytest.approx(total, rel=SUM_RTOL, abs=SUM_ATOL), name


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    import streamrec

    data = Path(streamrec.__file__).parent / "demo_data" / "movielens-latest-small"
    doc = {f"{learner}/{schema}": trained(learner, schema, data) for learner, schema in CASES}
    REFERENCE.write_text(_dumps(doc))
