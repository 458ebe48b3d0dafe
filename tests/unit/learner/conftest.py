"""The learner's unit tests run `LearnerRunner` on scripted consumers: no broker behind them."""

from __future__ import annotations

import pytest

from streamrec.learner import progress


@pytest.fixture(autouse=True)
def no_topic_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scripted consumer has no broker to ask for the samples topic's id: it names none, as a
    broker older than Kafka 2.8 would (`streamrec.kafka.topics.topic_id`).
    """
    monkeypatch.setattr(progress, "topic_id", lambda *_, **__: None)
