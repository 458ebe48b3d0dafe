"""Serving a model trained with declared features of every role, from the real Redis stores.

The history's behaviour features (outcomes included) come from the feature store, the user's
newest features from the profile store, a candidate's own behaviour features and the context
from the request: `POST /score` and `streamrec score` give what the learner's `predict_many`
gives for the same sample; an absent feature reads its default; a bad value is a 400 naming it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import msgspec
import numpy as np
import orjson
import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner, Result

from streamrec.cli import app
from streamrec.config import RedisStoreConfig
from streamrec.events import Event
from streamrec.features.schema import Value
from streamrec.featurestore import RedisFeatureStore
from streamrec.featurestore.base import Arrival
from streamrec.featurestore.profiles import ProfilePoint
from streamrec.featurestore.redis_profiles import RedisProfileStore
from streamrec.learner.columns import SampleColumns
from streamrec.learner.din import DINLearner
from streamrec.samples import Sample
from streamrec.serving.features import StoredHistory, store_history
from streamrec.serving.http import build_app
from streamrec.serving.scorer import Scorer
from tests.unit.learner.test_features import SCHEMA, T0, featured, model

pytest.importorskip("paddle")

# u7's stored behaviours: item, category, genres, rating (an outcome), price
BEHAVIOURS: list[tuple[str, str, list[str], float, float | None]] = [
    ("i8", "c1", ["a"], 4.0, 3.0), ("i9", "c2", ["b", "c"], 1.0, None), ("i3", "c1", [], 5.0, 10.0),
]
CONTEXT = {"device": "ios"}


def _snapshots(root: Path) -> DINLearner:
    """A DIN trained under ``SCHEMA`` (behaviour, outcome, user and context features), promoted."""
    from streamrec.learner.snapshotting import group_state
    from streamrec.snapshots.store import SnapshotStore

    learner = DINLearner(model(), schema=SCHEMA)
    samples = [  # ratings of 1-5 along the history: standardize learns a spread
        msgspec.structs.replace(s, seq_features={**s.seq_features, "rating": (float(k % 5 + 1), None)})
        for k, s in enumerate(featured(32))
    ]
    for _ in range(3):
        learner.learn_many(SampleColumns.from_samples(samples))
    store = SnapshotStore(root)
    manifest = store.write(
        group_state(learner.state_arrays()), micro_batches=1, samples_trained=0, positions=(),
        config={"model": learner.cfg.model_dump(mode="json"), "features": SCHEMA.to_json()},
    )
    store.promote(manifest.version)
    return learner


def _fill(store_config: RedisStoreConfig) -> tuple[RedisFeatureStore, RedisProfileStore]:
    store = RedisFeatureStore(store_config, length=4, dedup_horizon_ms=86_400_000, schema=SCHEMA)
    store.attach(can_start_empty=True)
    arrivals = []
    for k, (item, category, genres, rating, price) in enumerate(BEHAVIOURS):
        features: dict[str, Value] = {"genres": tuple(genres), "rating": rating}
        if price is not None:
            features["price"] = price
        event = Event(f"e{k}", "u7", item, category, "click", T0 + k, features=features)
        arrivals.append(Arrival(event, f"0:{k}"))
    store.update(arrivals).all()
    profiles = RedisProfileStore(store_config, points=4)
    profiles.update([ProfilePoint("u7", T0 + 1, {"age": 25.0}), ProfilePoint("u7", T0 + 5, {"age": 41.0})])
    return store, profiles


def _sample(item: str, category: str, **features: object) -> Sample:
    """u7's sample for ``item``, as the consumers would make it at the present moment."""
    return Sample(
        "s", "u7", T0 + 10, item, category, 0,
        tuple(b[0] for b in BEHAVIOURS), tuple(b[1] for b in BEHAVIOURS),
        features=features,  # type: ignore[arg-type]  # the test's values are of the right kinds
        seq_features={
            "genres": tuple(tuple(b[2]) for b in BEHAVIOURS),
            "rating": tuple(b[3] for b in BEHAVIOURS),
            "price": tuple(b[4] for b in BEHAVIOURS),
        },
    )


def test_served_scores_read_every_declared_feature_as_the_learner_does(
    tmp_path: Path, store_config: RedisStoreConfig
) -> None:
    learner = _snapshots(tmp_path / "snapshots")
    store, profiles = _fill(store_config)
    history_of = store_history(store, profiles)
    stored = history_of("u7")
    assert isinstance(stored, StoredHistory) and stored == [b[:2] for b in BEHAVIOURS]
    assert stored.user_features == {"age": 41.0}  # the newest point: the user as of now
    assert stored.features["price"] == (3.0, None, 10.0)

    full = [_sample("i1", "c1", genres=("a", "b"), price=7.0, age=41.0, device="ios"),
            _sample("i2", "c2", genres=("c",), age=41.0, device="ios")]
    absent = [_sample("i1", "c1", age=41.0)]  # no candidate features, no context
    want = learner.predict_many(SampleColumns.from_samples(full))
    want_absent = learner.predict_many(SampleColumns.from_samples(absent))
    assert ((want > 0.01) & (want < 0.99)).all(), want  # not saturated: the comparison means something
    items = [{"item_id": "i1", "category_id": "c1", "genres": ["a", "b"], "price": 7},
             {"item": "i2", "category": "c2", "genres": ["c"], "rating": 5.0}]  # an outcome is no target's
    scorer = Scorer(tmp_path / "snapshots")
    with TestClient(build_app(scorer, history_of)) as client:
        response = client.post("/score", json={"user": "u7", "items": items, "context": CONTEXT})
        assert response.status_code == 200, response.text
        np.testing.assert_allclose(response.json()["scores"], want, rtol=1e-4, atol=1e-6)
        response = client.post("/score", json={"user": "u7", "items": ["i1:c1"]})
        np.testing.assert_allclose(response.json()["scores"], want_absent, rtol=1e-4, atol=1e-6)
        assert not np.allclose(want_absent, want[:1], atol=1e-4)  # the features matter
        cases: list[tuple[dict[str, object], str]] = [
            ({"items": [{"item_id": "i1", "genres": "Drama"}]}, "genres"),
            ({"items": [{"item_id": "i1", "price": -5}]}, "price"),
            ({"items": ["i1"], "context": {"device": ["ios"]}}, "device"),
        ]
        for bad, feature in cases:
            response = client.post("/score", json={"user": "u7", **bad})
            assert response.status_code == 400, response.text
            assert f"feature {feature!r}" in response.json()["error"]

    env = {"STREAMREC_STORE__URL": store_config.url, "STREAMREC_STORE__KEY_PREFIX": store_config.key_prefix,
           "STREAMREC_MODEL__SEQUENCE_LENGTH": "4", "STREAMREC_CONSUMER__PROFILE_POINTS": "4",
           "STREAMREC_FEATURES": orjson.dumps([f.meaning() for f in SCHEMA.extras]).decode()}
    result = CliRunner().invoke(
        app, ["score", "--user", "u7", "--items", orjson.dumps(items).decode(), "--json",
              "--context", orjson.dumps(CONTEXT).decode(), "--snapshot-dir", str(tmp_path / "snapshots")],
        env=env,
    )
    assert result.exit_code == 0, result.output
    doc = orjson.loads(result.stdout)
    assert doc["history"] == 3
    np.testing.assert_allclose(doc["scores"], want, rtol=1e-4, atol=1e-6)
    result = CliRunner().invoke(
        app, ["score", "--user", "u7", "--items", '[{"item_id": "i1", "genres": "Drama"}]',
              "--snapshot-dir", str(tmp_path / "snapshots")],
        env=env,
    )
    assert result.exit_code != 0 and "feature 'genres'" in result.output


def _given_history() -> list[object]:
    """u7's stored behaviours as a request gives them: objects with their features, and a pair."""
    given: list[object] = []
    for item, category, genres, rating, price in BEHAVIOURS[:-1]:
        entry: dict[str, object] = {"item_id": item, "category_id": category}
        entry |= {"genres": genres, "rating": rating}
        if price is not None:
            entry["price"] = price
        given.append(entry)
    item, category, genres, rating, price = BEHAVIOURS[-1]
    given.append({"item": item, "category": category, "genres": genres, "rating": rating, "price": price})
    return given


def test_a_history_given_in_the_request_scores_as_the_same_history_read_from_the_store(
    tmp_path: Path, store_config: RedisStoreConfig
) -> None:
    _snapshots(tmp_path / "snapshots")
    store, profiles = _fill(store_config)
    scorer = Scorer(tmp_path / "snapshots")
    items = [{"item_id": "i1", "category_id": "c1", "genres": ["a", "b"], "price": 7}, "i2:c2"]
    request = {"user": "u7", "items": items, "context": CONTEXT}
    pairs = [list(b[:2]) for b in BEHAVIOURS]
    users = {"user_features": {"age": 41.0}}  # the profile store's newest, as the request gives it
    with TestClient(build_app(scorer, store_history(store, profiles))) as client:
        stored = client.post("/score", json=request)
        given = client.post("/score", json={**request, "history": _given_history(), **users})
        no_user = client.post("/score", json={**request, "history": _given_history()})
        bare = client.post("/score", json={**request, "history": pairs, **users})
        mixed = client.post("/score", json={**request, "history": [*pairs[:2], _given_history()[2]], **users})
        assert {r.status_code for r in (stored, given, no_user, bare, mixed)} == {200}, given.text
        np.testing.assert_allclose(given.json()["scores"], stored.json()["scores"], rtol=1e-6)
        # the features matter, each entry's own, and the user's
        assert not np.allclose(no_user.json()["scores"], stored.json()["scores"], atol=1e-6)
        assert not np.allclose(bare.json()["scores"], stored.json()["scores"], atol=1e-4)
        assert not np.allclose(mixed.json()["scores"], given.json()["scores"], atol=1e-4)
        cases: list[tuple[object, str]] = [
            ({"item_id": "i8", "category_id": "c1", "genres": "a"}, "feature 'genres'"),
            ({"item_id": "i8", "category_id": "c1", "price": -5}, "feature 'price'"),
            ({"item_id": "i8", "category_id": "c1", "rating": "good"}, "feature 'rating'"),
            ({"item_id": "i8"}, "'history'"),
            ({"category_id": "c1", "genres": ["a"]}, "'history'"),
            (["i8"], "'history'"),
            ("i8:c1", "'history'"),
        ]
        for bad, reason in cases:
            response = client.post("/score", json={**request, "history": [pairs[0], bad]})
            assert response.status_code == 400, (bad, response.text)
            assert reason in response.json()["error"], response.json()
        refused = [({**request, **users}, "'user_features' come with the request's own 'history'"),
                   ({**request, "history": pairs, "user_features": {"age": "old"}}, "feature 'age'")]
        for body, reason in refused:
            response = client.post("/score", json=body)
            assert response.status_code == 400 and reason in response.json()["error"], response.text

    def score(history: object, *more: str) -> Result:  # streamrec score, with no feature store
        return CliRunner().invoke(
            app, ["score", "--user", "u7", "--items", orjson.dumps(items).decode(), "--json", "--no-store",
                  "--context", orjson.dumps(CONTEXT).decode(), "--history", orjson.dumps(history).decode(),
                  "--snapshot-dir", str(tmp_path / "snapshots"), *more],
            env={"STREAMREC_MODEL__SEQUENCE_LENGTH": "4",
                 "STREAMREC_FEATURES": orjson.dumps([f.meaning() for f in SCHEMA.extras]).decode()},
        )

    result = score(_given_history(), "--user-features", orjson.dumps(users["user_features"]).decode())
    assert result.exit_code == 0, result.output
    doc = orjson.loads(result.stdout)
    assert doc["history"] == 3
    np.testing.assert_allclose(doc["scores"], given.json()["scores"], rtol=1e-6)
    result = score(_given_history())
    np.testing.assert_allclose(orjson.loads(result.stdout)["scores"], no_user.json()["scores"], rtol=1e-6)
    result = score(_given_history(), "--user-features", "[41]")
    assert result.exit_code != 0 and "--user-features must be a JSON object" in result.output, result.output
    for bad, reason in [(cases[0][0], "feature 'genres'"), ({"item_id": "i8"}, "--history: 'history'")]:
        result = score([bad])
        assert result.exit_code != 0 and reason in result.output, result.output


def test_a_request_feature_the_model_ignores_is_named_once_and_still_scored(
    tmp_path: Path, store_config: RedisStoreConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """Found from outside: candidates that carried ``genre`` for the declared ``genres`` and a
    context that carried the user feature ``age`` were scored from defaults, 200 OK, with no
    word anywhere; now the server names each once (`streamrec.serving.drift`).
    """
    _snapshots(tmp_path / "snapshots")
    store, profiles = _fill(store_config)
    scorer = Scorer(tmp_path / "snapshots")
    request = {"user": "u7", "items": [{"item_id": "i1", "genre": ["a"]}], "context": {"age": 30, **CONTEXT}}
    app_ = build_app(scorer, store_history(store, profiles))
    with TestClient(app_) as client, caplog.at_level(logging.WARNING):
        for _ in range(2):
            assert client.post("/score", json=request).status_code == 200
    said = [r.getMessage() for r in caplog.records if r.name == "streamrec.serving.drift"]
    assert len(said) == 2, said
    assert "'age', a user feature" in said[0] and "'genre', which the served" in said[1], said
