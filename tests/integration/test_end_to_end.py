"""A generated click stream through producer -> consumers -> Redis -> learner -> snapshots."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from streamrec import faults
from streamrec.cli import app
from streamrec.config import KafkaConfig, RedisStoreConfig, StreamrecConfig
from streamrec.consumers.native_runner import ConsumerRunner
from streamrec.events import Event
from streamrec.featurestore import Behaviour, RedisFeatureStore
from streamrec.learner.din import DINLearner
from streamrec.learner.metrics import auc
from streamrec.learner.runner import LearnerRunner, MicroBatchReport
from streamrec.pipeline import run_pipeline
from streamrec.producer import publish
from streamrec.samples import Sample
from streamrec.snapshots.store import SnapshotStore

SEQ = 20


@pytest.fixture
def events(clicks: list[Event]) -> list[Event]:
    return clicks[:4000]


@pytest.fixture
def make_config(pipeline_config: Callable[..., StreamrecConfig]) -> Callable[[], StreamrecConfig]:
    return lambda: pipeline_config(
        consumer={"batch_size": 500, "negatives": 1},
        model={"sequence_length": SEQ},
        learner={"max_batch_samples": 2000, "snapshot_every": 2},
    )


def learner_runner(cfg: StreamrecConfig) -> LearnerRunner:
    return LearnerRunner(cfg, DINLearner(cfg.model))


def test_end_to_end(
    events: list[Event], make_config: Callable[[], StreamrecConfig], kafka_config: KafkaConfig,
    store_config: RedisStoreConfig, tmp_path: Path, topic_reader,
) -> None:
    cfg = make_config()
    reports: list[MicroBatchReport] = []
    result = run_pipeline(cfg, events, on_report=reports.append)
    assert result.published == result.consumer.events == len(events)
    assert result.consumer.dead == 0

    # Sequences in Redis equal a recomputation from the file.
    by_user: dict[str, list[Behaviour]] = defaultdict(list)
    for event in events:
        by_user[event.user_id].append(Behaviour.of(event))
    for seq in by_user.values():
        seq.sort(key=Behaviour.sort_key)
    store = RedisFeatureStore(store_config, SEQ)
    for user, seq in by_user.items():
        assert store.sequence(user) == seq[-SEQ:], user

    # Every sample carries exactly the user's behaviour strictly before it: no leakage.
    records = topic_reader(kafka_config.samples_topic)
    samples = [Sample.from_json(m.value()) for m in records]
    assert len(samples) == result.consumer.samples
    positives = [e for e in events if e.action == "pv"]
    assert sum(s.label for s in samples) == len(positives)
    for sample in samples:
        earlier = [b for b in by_user[sample.user_id] if b.ts < sample.ts][-SEQ:]
        assert sample.seq_items == tuple(b.item_id for b in earlier), sample.sample_id
        assert sample.seq_categories == tuple(b.category_id for b in earlier)

    # Negatives are as novel as positives, so the AUC measures the model, not the sampler.
    first_seen: dict[str, int] = {}
    for e in events:
        first_seen[e.item_id] = min(e.ts, first_seen.get(e.item_id, e.ts))
    novelty = cfg.consumer.novelty_ms

    def new_share(label: int) -> float:
        flags = [first_seen[s.item_id] > s.ts - novelty for s in samples if s.label == label]
        return sum(flags) / len(flags)

    assert new_share(1) > 0.3  # many targets are new items, as on Taobao: the trap is live
    assert abs(new_share(1) - new_share(0)) < 0.05, (new_share(1), new_share(0))
    # "The target is new" alone must not separate positives from negatives.
    labels = np.array([s.label for s in samples])
    is_new = np.array([first_seen[s.item_id] > s.ts - novelty for s in samples], dtype=float)
    assert abs(auc(labels, is_new) - 0.5) < 0.05

    # The learner trained several micro-batches and its snapshot points at what it consumed.
    assert result.learner.micro_batches >= 2
    assert result.learner.samples_trained == len(samples)
    latest = SnapshotStore(tmp_path).latest()
    assert latest is not None and len(result.snapshots) >= 2
    consumed: dict[int, int] = {}
    for msg in records:
        consumed[msg.partition()] = max(consumed.get(msg.partition(), 0), msg.offset() + 1)
    assert {p.partition: p.offset for p in latest.positions} == consumed
    assert latest.samples_trained == len(samples)
    assert "known_auc" in latest.metrics and "gauc" in latest.metrics
    # The learner's own sampler-leak detector: "target unknown to the model" alone ~ chance.
    scored = [r.metrics for r in reports[1:] if not np.isnan(r.metrics.novelty_auc)]
    novelty = np.average([m.novelty_auc for m in scored], weights=[m.samples for m in scored])
    assert abs(float(novelty) - 0.5) < 0.1, [(m.samples, m.novelty_auc) for m in scored]

    # A restarted learner resumes from the snapshot: nothing is trained twice.
    stats = learner_runner(cfg).run()
    assert stats.micro_batches == result.learner.micro_batches
    assert stats.samples_trained == len(samples)


def test_snapshot_create_asks_the_running_learner(
    make_config: Callable[[], StreamrecConfig], tmp_path: Path
) -> None:
    cfg = make_config()
    stop = threading.Event()
    learner = learner_runner(cfg)
    thread = threading.Thread(target=learner.run, args=(stop,))
    thread.start()
    try:
        args = ["snapshot", "create", "--snapshot-dir", str(tmp_path), "--timeout", "30"]
        out = CliRunner().invoke(app, args)
    finally:
        stop.set()
        thread.join()
    assert out.exit_code == 0, out.output
    assert "snapshot v000001 written" in out.output
    assert SnapshotStore(tmp_path).manifest(1).request_id is not None
    listing = CliRunner().invoke(app, ["snapshot", "list", "--snapshot-dir", str(tmp_path)])
    assert "v000001" in listing.output


def test_snapshot_create_without_a_learner_is_a_clear_error(tmp_path: Path) -> None:
    """And it says as it starts that no learner holds the directory: it waited its whole
    timeout (60 s by default) without a word (noted by a tour).
    """
    out = CliRunner().invoke(app, ["snapshot", "create", "--snapshot-dir", str(tmp_path), "--timeout", "1"])
    assert out.exit_code == 1
    assert "no learner answered" in out.output
    said = " ".join(out.stderr.split())
    assert said.startswith(f"no learner holds {tmp_path} now: waiting 1 s for one to start"), said


def test_a_learner_crash_resumes_from_the_last_snapshot(
    events: list[Event], make_config: Callable[[], StreamrecConfig], kafka_config: KafkaConfig,
    monkeypatch: pytest.MonkeyPatch, topic_reader,
) -> None:
    cfg = make_config()
    publish(events, kafka_config)
    consumed = ConsumerRunner(cfg).run()  # all samples first: the learner starts on a backlog
    total = len(topic_reader(kafka_config.samples_topic))
    assert total == consumed.samples

    faults.reset()
    monkeypatch.setenv(faults.ENV, "learner.after_train:3")  # dies after micro-batch 3
    with pytest.raises(faults.InjectedFault):
        learner_runner(cfg).run()
    latest = SnapshotStore(cfg.learner.snapshot_dir).latest()
    assert latest is not None and latest.micro_batches == 2  # snapshot_every=2: batch 3 lost

    monkeypatch.delenv(faults.ENV)
    resumed = learner_runner(cfg)
    assert resumed.stats.micro_batches == 2
    stats = resumed.run()
    # Every sample trained exactly once into the surviving model: batch 3 was redone.
    assert stats.samples_trained == total
