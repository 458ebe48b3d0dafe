"""The ready-made schemas in examples/: they load, and name fields their datasets give."""

from __future__ import annotations

from pathlib import Path

from streamrec.config import load_config
from streamrec.datasets.readers import MOVIELENS_FIELDS
from streamrec.datasets.synthetic import ClickStreamSpec, generate_rows

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def test_the_movielens_schema_declares_what_the_reader_gives() -> None:
    schema = load_config(EXAMPLES / "movielens" / "streamrec.toml").feature_schema()
    assert schema.names == (
        "item", "category", "genres", "year", "rating", "user_ratings", "user_mean_rating"
    )
    assert {f.source for f in schema.extras} == set(MOVIELENS_FIELDS)
    assert schema["rating"].outcome  # the label's own value: along the history only
    assert not schema["genres"].outcome and not schema["year"].outcome
    assert [f.name for f in schema.role("user")] == ["user_ratings", "user_mean_rating"]


def test_the_feed_schema_declares_the_generated_device() -> None:
    cfg = load_config(EXAMPLES / "feed" / "streamrec.toml")
    schema = cfg.feature_schema()
    assert [(f.name, f.kind, f.role) for f in schema.extras] == [("device", "id", "context")]
    [(_, fields)] = generate_rows(ClickStreamSpec(events=1, users=1, device_effect=0.5))
    assert set(fields) == {f.source for f in schema.extras}
    assert cfg.consumer.labels == "join"
