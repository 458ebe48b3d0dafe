"""The learner names the features its samples and its own schema disagree on, once each a run.

Found from outside: the consumers and the learner read their settings each on their own, and
the MovieLens example's five features declared to the learner alone trained 3,000 samples with
none of them, without a word (and the other way round, features the consumers send are never
trained on).
"""

from __future__ import annotations

import logging

import pytest

from streamrec.features import FeatureSchema, FeatureSpec
from streamrec.learner.columns import SampleColumns
from streamrec.learner.drift import FeatureDrift
from streamrec.samples import FeatureValue, Sample


def batch(n: int, **features: FeatureValue | None) -> SampleColumns:
    seq = {k[4:]: v for k, v in features.items() if k.startswith("seq_")}
    own = {k: v for k, v in features.items() if not k.startswith("seq_") and v is not None}
    return SampleColumns.from_samples([
        Sample(f"e{k}", "u1", 1_700_000_000_000 + k, f"i{k}", "c1", k % 2, ("i0",), ("c0",),
               dict(own), {name: (value,) for name, value in seq.items()})
        for k in range(n)
    ])


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_feature_the_samples_carry_and_the_learner_does_not_declare_is_named_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    drift = FeatureDrift(FeatureSchema.default())
    with caplog.at_level(logging.WARNING, "streamrec.learner.drift"):
        drift.observe(batch(10, device="ios", seq_dwell_s=3.0))
        drift.observe(batch(10, device="web", seq_dwell_s=4.0))
    said = warnings(caplog)
    assert len(said) == 2, said
    assert "'device'" in said[0] and "'dwell_s'" in said[1] and "not trained on" in said[0]
    assert "STREAMREC_FEATURES" in said[0]


def test_a_declared_feature_no_sample_carries_is_named_once_after_enough_samples(
    caplog: pytest.LogCaptureFixture,
) -> None:
    schema = FeatureSchema.of([
        FeatureSpec(name="tier", role="user"), FeatureSpec(name="device", role="context"),
    ])
    drift = FeatureDrift(schema, absent_after=30)
    with caplog.at_level(logging.WARNING, "streamrec.learner.drift"):
        drift.observe(batch(20, device="ios"))
        assert warnings(caplog) == []  # too few samples yet: a rare feature may still turn up
        drift.observe(batch(20))
        drift.observe(batch(20))
    said = warnings(caplog)
    assert len(said) == 1 and "'tier'" in said[0] and "none of the 40 samples" in said[0], said
    assert "reads its default" in said[0]


def test_a_feature_carried_along_the_history_alone_counts_as_carried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # an outcome (a rating) is carried along the history only, never for the target
    schema = FeatureSchema.of([FeatureSpec(name="rating", kind="number", role="behaviour", outcome=True)])
    drift = FeatureDrift(schema, absent_after=1)
    with caplog.at_level(logging.WARNING, "streamrec.learner.drift"):
        drift.observe(batch(5, seq_rating=4.0))
    assert warnings(caplog) == []


def test_samples_and_learner_that_agree_say_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "streamrec.learner.drift"):
        FeatureDrift(FeatureSchema.default(), absent_after=1).observe(batch(5))
        device = FeatureSchema.of([FeatureSpec(name="device")])
        FeatureDrift(device, absent_after=1).observe(batch(5, device="a"))
    assert warnings(caplog) == []


def test_a_declared_feature_the_samples_carry_only_empty_is_named(caplog: pytest.LogCaptureFixture) -> None:
    # Found by a tour of docs/your-features.md: `genre` declared to the consumers and the learner
    # alike, the events carrying `genres`. The consumers put "genre": [null, ...] along every
    # history, so the learner counted it carried and said nothing over 5,996 samples, each
    # trained at the feature's default. A feature counts as carried once a sample has a value.
    schema = FeatureSchema.of([
        FeatureSpec(name="genre", kind="ids", role="behaviour"), FeatureSpec(name="tier", role="user"),
        FeatureSpec(name="price", kind="number", role="behaviour"),
    ])
    drift = FeatureDrift(schema, absent_after=20)
    with caplog.at_level(logging.WARNING, "streamrec.learner.drift"):
        drift.observe(batch(10, seq_genre=None, seq_price=None))
        drift.observe(batch(10, seq_genre=None, seq_price=2.0))
    said = warnings(caplog)
    assert len(said) == 2 and "'genre'" in said[0] and "'tier'" in said[1], said
    assert "its field" in said[0]
