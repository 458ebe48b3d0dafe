"""A micro-batch trained in parts while it is gathered, on the real broker.

Every sample is trained once and the micro-batch snapshotted once, at its close; a crash
between parts resumes from the last snapshot and trains the parts again, once; a part as long
as the interval is the micro-batch trained whole, as before parts, bit for bit; a backlog is
trained in parts of at most ``max_part_samples``, and a learner process killed between them
resumes training each sample once; a snapshot request closes a micro-batch partly trained.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Mapping

import numpy as np
import pytest
from confluent_kafka import Message, Producer
from typer.testing import CliRunner

from streamrec import faults
from streamrec.cli import app
from streamrec.config import ModelConfig, StreamrecConfig
from streamrec.learner.base import TrainResult
from streamrec.learner.columns import SampleColumns
from streamrec.learner.din import DINLearner
from streamrec.learner.reports import MicroBatchReport, StepResult, scored_report
from streamrec.learner.runner import LearnerRunner, LearnerStats
from streamrec.learner.scored import Scored
from streamrec.samples import Sample
from streamrec.snapshots.store import SnapshotManifest, SnapshotStore
from tests.support import small_tables

TS = 1_511_658_000_000
WAIT_S = 60.0  # for the learner to train what was published: seconds on a busy machine


class Recording(DINLearner):
    """A DIN that records each part it trains (a micro-batch trained whole is one) and each close."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.parts: list[SampleColumns] = []
        self.closes = 0
        self.changed = threading.Condition()

    def learn_part(self, batch: SampleColumns) -> TrainResult:
        return self._record(batch, super().learn_part(batch))

    def learn_many(self, batch: SampleColumns) -> TrainResult:
        return self._record(batch, super().learn_many(batch))

    def _record(self, batch: SampleColumns, result: TrainResult) -> TrainResult:
        with self.changed:
            self.parts.append(batch)
            self.changed.notify_all()
        return result

    def end_micro_batch(self) -> None:
        super().end_micro_batch()
        self.closes += 1

    def trained_ids(self) -> list[str]:
        return [sid for batch in self.parts for sid in batch.sample_ids]

    def wait_for(self, count: int) -> None:
        """Until ``count`` samples are trained."""
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.trained_ids()) >= count, WAIT_S), count


def sample(n: int) -> Sample:
    seq = tuple(range(n % 7))
    return Sample(
        f"s{n}", f"u{n % 13}", TS + n * 1000, f"i{n % 50}", f"c{n % 9}", n % 2,
        tuple(f"i{k}" for k in seq), tuple(f"c{k}" for k in seq),
    )


def publish(cfg: StreamrecConfig, numbers: range) -> None:
    producer = Producer({"bootstrap.servers": cfg.kafka.bootstrap_servers})
    for n in numbers:
        s = sample(n)
        producer.produce(cfg.kafka.samples_topic, key=s.user_id.encode(), value=s.to_json(), timestamp=s.ts)
    assert producer.flush(10) == 0


def ends(records: list[Message]) -> dict[int, int]:
    """The next offset of each partition past ``records``."""
    out: dict[int, int] = {}
    for msg in records:
        partition, offset = msg.partition(), msg.offset()
        assert partition is not None and offset is not None
        out[partition] = max(out.get(partition, 0), offset + 1)
    return out


class Running:
    """A runner on a thread; ``finish`` stops it and hands back its stats or its failure."""

    def __init__(self, runner: LearnerRunner) -> None:
        self.stop = threading.Event()
        self.outcome: list[LearnerStats | BaseException] = []
        self.thread = threading.Thread(target=self._run, args=(runner,))
        self.thread.start()

    def _run(self, runner: LearnerRunner) -> None:
        try:
            self.outcome.append(runner.run(self.stop))
        except BaseException as exc:
            self.outcome.append(exc)

    def finish(self) -> LearnerStats | BaseException:
        self.stop.set()
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive()
        return self.outcome[0]


@pytest.fixture
def parts_config(pipeline_config: Callable[..., StreamrecConfig]) -> Callable[..., StreamrecConfig]:
    """Parts every 0.3 s of at least 10 samples, a long interval, a snapshot a micro-batch."""
    return lambda **learner: pipeline_config(
        model={"tables": small_tables(2**10, 2**6, dim=4), "sequence_length": 8, "ewc_lambda": 1.0},
        learner={
            "interval_s": 300.0, "part_s": 0.3, "min_eval_samples": 10, "snapshot_every": 1,
            "stop_when_idle_s": None, **learner,
        },
    )


def test_a_micro_batch_trained_in_parts_trains_every_sample_once_and_snapshots_once(
    parts_config: Callable[..., StreamrecConfig], topic_reader: Callable[[str], list[Message]],
) -> None:
    cfg = parts_config()
    learner = Recording(cfg.model)
    reports: list[MicroBatchReport] = []
    snapshots: list[SnapshotManifest] = []
    running = Running(LearnerRunner(cfg, learner, on_report=reports.append, on_snapshot=snapshots.append))
    for chunk in range(4):  # each chunk published once the one before is trained: a part each
        publish(cfg, range(chunk * 40, chunk * 40 + 40))
        learner.wait_for(chunk * 40 + 40)
    assert not reports and not snapshots  # the micro-batch is still open
    stats = running.finish()  # the stop closes it

    assert isinstance(stats, LearnerStats)
    assert len(learner.parts) >= 4 and learner.closes == 1
    assert Counter(learner.trained_ids()) == Counter(f"s{n}" for n in range(160))  # each once
    assert (stats.micro_batches, stats.samples_trained) == (1, 160)
    assert len(reports) == 1 and reports[0].metrics.samples == 160
    assert reports[0].steps >= len(learner.parts)
    assert [m.version for m in snapshots] == [1]
    assert snapshots[0].samples_trained == 160
    records = topic_reader(cfg.kafka.samples_topic)
    assert {p.partition: p.offset for p in snapshots[0].positions} == ends(records)

    again = Recording(cfg.model)
    resumed = LearnerRunner(parts_config(stop_when_idle_s=3.0), again).run()
    assert (resumed.micro_batches, resumed.samples_trained) == (1, 160) and not again.parts


def test_a_crash_between_parts_resumes_from_the_last_snapshot_and_trains_each_sample_once(
    parts_config: Callable[..., StreamrecConfig], topic_reader: Callable[[str], list[Message]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = parts_config(max_batch_samples=100)
    faults.reset()
    first = Recording(cfg.model)
    written = threading.Event()
    running = Running(LearnerRunner(cfg, first, on_snapshot=lambda _: written.set()))
    publish(cfg, range(100))  # micro-batch 1, closed full and snapshotted
    assert written.wait(WAIT_S)
    monkeypatch.setenv(faults.ENV, "learner.after_part:2")  # dies after the next micro-batch's 2nd part
    publish(cfg, range(100, 130))
    first.wait_for(130)
    publish(cfg, range(130, 160))
    running.thread.join(WAIT_S)
    assert isinstance(running.finish(), faults.InjectedFault)
    trained = Counter(first.trained_ids())
    assert max(trained.values()) == 1 and {f"s{n}" for n in range(130)} <= set(trained)  # parts trained...
    store = SnapshotStore(cfg.learner.snapshot_dir)
    latest = store.latest()
    assert latest is not None and (latest.version, latest.samples_trained) == (1, 100)  # ...not kept

    monkeypatch.delenv(faults.ENV)
    second = Recording(cfg.model)
    stats = LearnerRunner(parts_config(max_batch_samples=100, stop_when_idle_s=3.0), second).run()
    # The resumed learner starts from version 1's weights and positions: only the lost parts again.
    assert Counter(second.trained_ids()) == Counter(f"s{n}" for n in range(100, 160))
    assert (stats.micro_batches, stats.samples_trained) == (2, 160)
    latest = store.latest()
    assert latest is not None and latest.samples_trained == 160
    assert {p.partition: p.offset for p in latest.positions} == ends(topic_reader(cfg.kafka.samples_topic))


def test_a_part_as_long_as_the_interval_is_the_micro_batch_trained_whole(
    parts_config: Callable[..., StreamrecConfig],
) -> None:
    cfg = parts_config(part_s=300.0, max_batch_samples=80, stop_when_idle_s=3.0)
    publish(cfg, range(200))
    learner = Recording(cfg.model)
    reports: list[MicroBatchReport] = []
    LearnerRunner(cfg, learner, on_report=reports.append).run()
    assert len(learner.parts) == len(reports) == learner.closes == 3  # 80, 80, 40: one part each

    # The loop before parts: score, then learn_many, each micro-batch whole.
    whole = DINLearner(cfg.model)
    for index, (batch, report) in enumerate(zip(learner.parts, reports, strict=True), start=1):
        probs, known = whole.predict_many(batch), whole.is_known(batch)
        train = whole.learn_many(batch)
        step = StepResult(probs, known, train, report.score_seconds, report.train_seconds)
        expected = scored_report(index, Scored.of(batch, probs, known), step, 0, cfg.learner.min_eval_samples)
        np.testing.assert_equal(dataclasses.asdict(report), dataclasses.asdict(expected))
    _assert_same_state(learner.state_arrays(), whole.state_arrays())


def test_a_backlog_is_trained_in_parts_of_at_most_max_part_samples(
    parts_config: Callable[..., StreamrecConfig], topic_reader: Callable[[str], list[Message]],
) -> None:
    # A backlog fills a micro-batch at once, long before a part's time is up: a count ends its
    # parts, so what one part decodes (the samples as Python objects) is bounded by it.
    cfg = parts_config(part_s=300.0, max_part_samples=30, max_batch_samples=100, stop_when_idle_s=3.0)
    publish(cfg, range(200))
    learner = Recording(cfg.model)
    reports: list[MicroBatchReport] = []
    snapshots: list[SnapshotManifest] = []
    stats = LearnerRunner(cfg, learner, on_report=reports.append, on_snapshot=snapshots.append).run()
    sizes = [len(batch) for batch in learner.parts]
    assert sum(sizes) == 200 and max(sizes) <= 30 and len(sizes) >= 8, sizes
    assert Counter(learner.trained_ids()) == Counter(f"s{n}" for n in range(200))  # each once
    assert learner.closes == 2 and [r.metrics.samples for r in reports] == [100, 100]
    assert (stats.micro_batches, stats.samples_trained) == (2, 200)
    assert {p.partition: p.offset for p in snapshots[-1].positions} == ends(
        topic_reader(cfg.kafka.samples_topic)
    )


def test_a_learner_process_killed_between_a_backlogs_parts_resumes_training_each_sample_once(
    parts_config: Callable[..., StreamrecConfig], topic_reader: Callable[[str], list[Message]],
) -> None:
    # `streamrec learner run` dies on the spot (os._exit, as kill -9 leaves it: no finally, no
    # close) after the second part of its second micro-batch; run again, it resumes from the
    # first micro-batch's snapshot and trains the rest once.
    cfg = parts_config(part_s=300.0, max_part_samples=150, max_batch_samples=600)
    publish(cfg, range(1000))
    env = {
        **os.environ,
        "STREAMREC_KAFKA__BOOTSTRAP_SERVERS": cfg.kafka.bootstrap_servers,
        "STREAMREC_KAFKA__SAMPLES_TOPIC": cfg.kafka.samples_topic,
        "STREAMREC_KAFKA__SAMPLES_DLQ_TOPIC": cfg.kafka.samples_dlq_topic,
        "STREAMREC_MODEL__TABLES": json.dumps(cfg.model.model_dump(mode="json")["tables"]),
        "STREAMREC_MODEL__SEQUENCE_LENGTH": str(cfg.model.sequence_length),
        "STREAMREC_LEARNER__GROUP_ID": cfg.learner.group_id,
        "STREAMREC_LEARNER__MIN_EVAL_SAMPLES": str(cfg.learner.min_eval_samples),
        "STREAMREC_LEARNER__SNAPSHOT_EVERY": "1",
        "STREAMREC_LEARNER__METRICS_PORT": "0",
        "STREAMREC_LEARNER__PROMOTE": "off",
    }
    args = [
        sys.executable, "-m", "streamrec", "learner", "run", "--interval", "300", "--part", "300",
        "--max-part", "150", "--max-batch", "600", "--snapshot-dir", str(cfg.learner.snapshot_dir),
        "--stop-when-idle", "3",
    ]
    killed = {**env, faults.ENV: "learner.after_part:6", f"{faults.ENV}_MODE": "exit"}
    out = subprocess.run(args, env=killed, capture_output=True, text=True, timeout=180, check=False)
    assert out.returncode == 137, out.stderr[-3000:]
    store = SnapshotStore(cfg.learner.snapshot_dir)
    latest = store.latest()
    assert latest is not None and (latest.version, latest.samples_trained) == (1, 600), out.stderr[-3000:]

    out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    latest = store.latest()
    assert latest is not None and (latest.micro_batches, latest.samples_trained) == (2, 1000)
    assert {p.partition: p.offset for p in latest.positions} == ends(topic_reader(cfg.kafka.samples_topic))
    assert "micro_batch index=2 parts=3 " in out.stderr  # 150, 150 and 100, from the snapshot on


def _assert_same_state(mine: Mapping[str, np.ndarray], theirs: Mapping[str, np.ndarray]) -> None:
    assert mine.keys() == theirs.keys()
    for key, array in theirs.items():
        np.testing.assert_array_equal(mine[key], array, err_msg=key)


def test_a_snapshot_request_closes_a_micro_batch_partly_trained(
    parts_config: Callable[..., StreamrecConfig], topic_reader: Callable[[str], list[Message]],
) -> None:
    cfg = parts_config(snapshot_every=100)
    learner = Recording(cfg.model)
    running = Running(LearnerRunner(cfg, learner))
    publish(cfg, range(40))
    learner.wait_for(40)  # a part trained, the micro-batch open
    args = ["snapshot", "create", "--snapshot-dir", str(cfg.learner.snapshot_dir), "--timeout", "60"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    manifest = SnapshotStore(cfg.learner.snapshot_dir).latest()
    assert manifest is not None and manifest.request_id is not None
    assert (manifest.micro_batches, manifest.samples_trained) == (1, 40)  # the whole micro-batch
    assert {p.partition: p.offset for p in manifest.positions} == ends(topic_reader(cfg.kafka.samples_topic))
    publish(cfg, range(40, 80))
    learner.wait_for(80)
    stats = running.finish()
    assert isinstance(stats, LearnerStats) and (stats.micro_batches, stats.samples_trained) == (2, 80)
    assert Counter(learner.trained_ids()) == Counter(f"s{n}" for n in range(80))
