"""A samples topic deleted and created again (or a broker that keeps nothing, restarted) under a
learner's snapshots, on the real broker, counting every sample id trained.

The snapshot's positions are offsets in the old topic. Before: the learner resumed at them in
the new one without a word: it skipped the new topic's samples below them (or, with fewer
there, waited for offsets that were not coming), and its next snapshot recorded them as trained.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from streamrec.config import StreamrecConfig
from streamrec.errors import SamplesTopicRecreated
from streamrec.kafka.topics import ensure_topics
from streamrec.learner.runner import LearnerRunner
from streamrec.snapshots.store import SnapshotStore
from tests.integration.conftest import recreate_topic
from tests.integration.learner.test_rebalance import (
    MODEL,
    assert_once,
    publish,
    resumes_with_nothing_to_train,
    run_learner_process,
)
from tests.support import RecordingLearner, wait_for

COUNT = 300


@pytest.fixture
def learner_config(pipeline_config: Callable[..., StreamrecConfig]) -> StreamrecConfig:
    return pipeline_config(model=MODEL, learner={"interval_s": 1.0, "min_batch_samples": 1})


def allowed(cfg: StreamrecConfig) -> StreamrecConfig:
    return cfg.model_copy(update={"learner": cfg.learner.model_copy(update={"resume_on_new_topic": True})})


def test_a_recreated_samples_topic_is_refused_then_trained_from_its_start_when_allowed(
    learner_config: StreamrecConfig, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = learner_config
    first = publish(cfg.kafka.bootstrap_servers, cfg.kafka.samples_topic, COUNT)
    learner = RecordingLearner(cfg.model)
    LearnerRunner(cfg, learner).run()
    assert_once(learner.trained, first)
    new_id = recreate_topic(cfg.kafka, cfg.kafka.samples_topic)
    # Twice as many samples as before: every partition passes the snapshot's positions, so
    # the offsets alone look like an ordinary resume.
    second = publish(cfg.kafka.bootstrap_servers, cfg.kafka.samples_topic, 2 * COUNT, start=COUNT)

    untouched = RecordingLearner(cfg.model)
    with pytest.raises(SamplesTopicRecreated, match=rf"{cfg.kafka.samples_topic}.*now {re.escape(new_id)}"):
        LearnerRunner(cfg, untouched).run()
    assert untouched.trained == []

    again = RecordingLearner(cfg.model)
    with caplog.at_level(logging.WARNING, logger="streamrec.learner"):
        stats = LearnerRunner(allowed(cfg), again).run()
    assert "samples topic was created again" in caplog.text
    assert_once(again.trained, second)
    assert stats.samples_trained == 3 * COUNT
    resumes_with_nothing_to_train(cfg, 3 * COUNT)  # the new snapshot knows the new topic


def test_a_samples_topic_recreated_under_a_running_learner_records_nothing_of_it(
    learner_config: StreamrecConfig, tmp_path: Path,
) -> None:
    """The learner runs as its own process: librdkafka 2.16 crashes (SIGSEGV in its metadata
    cache) when a topic it reads is created again on this broker, and a learner that lives on
    refuses to snapshot positions of two topics. Either way the restart decides.
    """
    cfg = learner_config.model_copy(update={
        "learner": learner_config.learner.model_copy(update={"stop_when_idle_s": None, "snapshot_every": 1}),
    })
    publish(cfg.kafka.bootstrap_servers, cfg.kafka.samples_topic, COUNT)
    store = SnapshotStore(cfg.learner.snapshot_dir)
    proc = run_learner_process(cfg, tmp_path / "trained.json")
    try:
        wait_for(lambda: COUNT in [m.samples_trained for m in store.manifests()], what="a snapshot of them")
        versions = store.versions()
        recreate_topic(cfg.kafka, cfg.kafka.samples_topic)
        second = publish(cfg.kafka.bootstrap_servers, cfg.kafka.samples_topic, 2 * COUNT, start=COUNT)
        assert proc.wait(120) != 0
    finally:
        proc.kill()
        proc.wait(30)
    log = (tmp_path / "trained.log").read_text()
    assert store.versions() == versions, log  # nothing recorded past the old topic's last snapshot
    with pytest.raises(SamplesTopicRecreated):
        LearnerRunner(cfg, RecordingLearner(cfg.model)).run()

    again = RecordingLearner(cfg.model)
    stats = LearnerRunner(allowed(learner_config), again).run()
    assert_once(again.trained, second)
    assert stats.samples_trained == 3 * COUNT


def test_a_samples_topic_renamed_under_a_snapshot_is_named_as_such(learner_config: StreamrecConfig) -> None:
    """Found by the replay tour: ``learner run --samples-topic OTHER`` over a snapshot trained on
    ``streamrec.samples`` said that OTHER "was created again since the snapshot"; it is another
    topic, which the snapshot's positions never were offsets in.
    """
    cfg = learner_config
    publish(cfg.kafka.bootstrap_servers, cfg.kafka.samples_topic, COUNT)
    LearnerRunner(cfg, RecordingLearner(cfg.model)).run()
    other = f"{cfg.kafka.samples_topic}-other"
    moved = cfg.model_copy(update={"kafka": cfg.kafka.model_copy(update={"samples_topic": other})})
    ensure_topics(moved.kafka)
    second = publish(cfg.kafka.bootstrap_servers, other, COUNT, start=COUNT)

    untouched = RecordingLearner(cfg.model)
    said = rf"positions are offsets in the samples topic {re.escape(cfg.kafka.samples_topic)}, not {other}"
    with pytest.raises(SamplesTopicRecreated, match=said):
        LearnerRunner(moved, untouched).run()
    assert untouched.trained == []
    again = RecordingLearner(cfg.model)
    stats = LearnerRunner(allowed(moved), again).run()
    assert_once(again.trained, second)
    assert stats.samples_trained == 2 * COUNT
