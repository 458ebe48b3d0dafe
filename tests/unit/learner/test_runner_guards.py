"""LearnerRunner against bad input and bad training, with no broker: a scripted consumer
serves in-memory records, a fake producer stands in for the samples DLQ.

Malformed samples are dead-lettered (acknowledged before positions pass them) and the rest
trained; non-finite steps make a micro-batch bad and too many in a row stop the learner; a
snapshot with a non-finite weight is never written.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import orjson
import pytest
from confluent_kafka import OFFSET_INVALID, KafkaError, TopicPartition

from streamrec.cli.common import print_report
from streamrec.config import KafkaConfig, StreamrecConfig
from streamrec.errors import (
    DeliveryError,
    LearnerFailed,
    NonFiniteWeights,
    SamplesExpired,
    SamplesTopicRecreated,
    TrainingDiverged,
)
from streamrec.kafka.records import Partition, Record
from streamrec.learner import progress
from streamrec.learner import runner as runner_module
from streamrec.learner.base import TrainResult
from streamrec.learner.columns import SampleColumns
from streamrec.learner.din import DINLearner
from streamrec.learner.intake import DeadLetterWriter
from streamrec.learner.metrics import MicroBatchMetrics
from streamrec.learner.runner import LearnerRunner, MicroBatchReport
from streamrec.samples import Sample
from streamrec.snapshots.store import SnapshotStore
from tests.unit.learner.test_din import HASHED as SMALL_MODEL

TOPIC = "samples"
DLQ = "samples-dlq"
TS = 1_511_658_000_000
GOOD = TrainResult(0.5, steps=2)
BAD = TrainResult(0.5, steps=2, skipped_steps=1)


def valid(n: int) -> bytes:
    return Sample(f"s{n}", f"u{n % 3}", TS + n, f"i{n}", f"c{n % 5}", n % 2, ("i1",), ("c1",)).to_json()


class ScriptedConsumer:
    """One partition of ``TOPIC``, assigned at the first consume; each scripted batch comes out
    of one consume call, then nothing.
    """

    def __init__(self, batches: list[list[bytes | None]]) -> None:
        self._batches: deque[list[Record]] = deque()
        offset = 0
        for values in batches:
            batch = [Record(v, offset + i, topic=TOPIC, key=b"u", timestamp=TS) for i, v in enumerate(values)]
            offset += len(values)
            self._batches.append(batch)
        self._on_assign: Callable[..., None] | None = None
        self.commits: list[list[TopicPartition]] = []
        self.earliest = 0  # the topic's first offset still held (retention moves it)

    def subscribe(self, topics: list[str], on_assign: Callable[..., None], **_: object) -> None:
        self._on_assign = on_assign

    def consume(self, size: int, timeout: float) -> list[Record]:
        if self._on_assign is not None:
            on_assign, self._on_assign = self._on_assign, None
            on_assign(self, [TopicPartition(TOPIC, 0)])
        if self._batches:
            return self._batches.popleft()
        time.sleep(min(timeout, 0.01))
        return []

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> None:
        self.commits.append(offsets)

    def get_watermark_offsets(self, partition: TopicPartition, timeout: float) -> tuple[int, int]:
        return self.earliest, 10**9

    def list_topics(self, topic: str, timeout: float) -> SimpleNamespace:
        return SimpleNamespace(topics={TOPIC: SimpleNamespace(partitions={0: None})})

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, OFFSET_INVALID) for tp in partitions]

    def assign(self, partitions: list[TopicPartition]) -> None: ...

    def pause(self, partitions: list[TopicPartition]) -> None: ...

    def resume(self, partitions: list[TopicPartition]) -> None: ...

    def seek(self, partition: TopicPartition) -> None: ...

    def close(self) -> None: ...


class FakeProducer:
    """Acknowledges (or refuses with ``error``) each record at flush; remembers them."""

    def __init__(self, error: KafkaError | None = None, on_flush: Callable[[], None] | None = None) -> None:
        self.records: list[dict[str, Any]] = []
        self._pending: list[Callable[..., None]] = []
        self._error = error
        self._on_flush = on_flush

    def produce(self, topic: str, **kw: Any) -> None:
        self.records.append({"topic": topic, **kw})
        self._pending.append(kw["on_delivery"])

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        if self._on_flush is not None:
            self._on_flush()
        for callback in self._pending:
            callback(self._error, None)
        self._pending.clear()
        return 0


class ScriptedLearner:
    """Returns the scripted TrainResults in turn; remembers the sample ids it trained on."""

    def __init__(self, results: list[TrainResult], weight: float = 0.0) -> None:
        self._results = deque(results)
        self.arrays: dict[str, np.ndarray] = {
            "model/w": np.full(4, weight, np.float32), "optimizer/w/moment1": np.zeros(4, np.float32),
            "state/n": np.arange(3),
        }
        self.trained: list[str] = []

    def predict_many(self, batch: SampleColumns) -> np.ndarray:
        return np.full(len(batch), 0.5)

    def is_known(self, batch: SampleColumns) -> np.ndarray:
        return np.zeros(len(batch), dtype=bool)

    def learn_many(self, batch: SampleColumns) -> TrainResult:
        self.trained.extend(batch.sample_ids)
        return self._results.popleft() if self._results else GOOD

    def state_arrays(self) -> dict[str, np.ndarray]:
        return {k: v.copy() for k, v in self.arrays.items()}

    def load_state_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.arrays = dict(arrays)


@pytest.fixture
def script(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Callable[[list[list[bytes | None]]], ScriptedConsumer]]:
    """``script(batches)``: the consumer the next runner gets."""
    made: list[ScriptedConsumer] = []

    def make(batches: list[list[bytes | None]]) -> ScriptedConsumer:
        made.append(ScriptedConsumer(batches))
        monkeypatch.setattr(runner_module, "make_consumer", lambda *_, **__: made[-1])
        return made[-1]

    yield make


def config(tmp_path: Path, batch: int, **learner: object) -> StreamrecConfig:
    return StreamrecConfig.model_validate({
        "kafka": {"samples_topic": TOPIC, "samples_dlq_topic": DLQ, "max_skew_ms": None},
        "learner": {
            "snapshot_dir": tmp_path, "max_batch_samples": batch, "interval_s": 5.0,
            "stop_when_idle_s": 0.3, "snapshot_every": 100, **learner,
        },
    })


def writer(producer: FakeProducer) -> DeadLetterWriter:
    return DeadLetterWriter(KafkaConfig(samples_dlq_topic=DLQ), 4096, make=lambda _: producer)  # type: ignore[arg-type, return-value]  # a fake producer


def header(record: dict[str, Any], name: str) -> bytes:
    return dict(record["headers"])[f"streamrec.{name}"]


def test_invalid_samples_are_dead_lettered_before_positions_pass_them(
    tmp_path: Path, script: Callable[..., ScriptedConsumer], caplog: pytest.LogCaptureFixture
) -> None:
    bad_label = orjson.dumps({**orjson.loads(valid(9)), "label": None})
    consumer = script([[valid(0), b"{oops", valid(1), None, bad_label, valid(2)]])
    positions_at_flush: list[dict[Partition, int]] = []
    runner: LearnerRunner | None = None

    def at_flush() -> None:
        assert runner is not None
        positions_at_flush.append(dict(runner.positions))

    producer = FakeProducer(on_flush=at_flush)
    learner = ScriptedLearner([])
    runner = LearnerRunner(config(tmp_path, 6), learner, dead_letters=writer(producer))
    with caplog.at_level(logging.WARNING, logger="streamrec.learner"):
        stats = runner.run()

    assert learner.trained == ["s0", "s1", "s2"]
    assert (stats.samples_trained, stats.dead, stats.micro_batches) == (3, 3, 1)
    # acknowledged while no position had passed them: the partition's still at its start
    assert positions_at_flush == [{Partition(TOPIC, 0): 0}]
    assert [r["value"] for r in producer.records] == [b"{oops", None, bad_label]
    assert [r["key"] for r in producer.records] == [b"u"] * 3
    assert all(r["topic"] == DLQ for r in producer.records)
    assert [header(r, "offset") for r in producer.records] == [b"1", b"3", b"4"]
    reasons = [header(r, "reason").decode() for r in producer.records]
    assert reasons[0].startswith("not valid JSON") and "null value" in reasons[1]
    assert "field 'label' must be 0 or 1" in reasons[2]
    assert "dead letter topic=samples partition=0 offset=4 dlq=samples-dlq reason=" in caplog.text
    manifest = SnapshotStore(tmp_path).latest()
    assert manifest is not None and [p.offset for p in manifest.positions] == [6]
    assert [tp.offset for tp in consumer.commits[-1]] == [6]


def test_a_dead_letter_the_broker_refuses_stops_the_learner_before_positions_move(
    tmp_path: Path, script: Callable[..., ScriptedConsumer]
) -> None:
    script([[valid(0), b"{oops"]])
    producer = FakeProducer(error=KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
    learner = ScriptedLearner([])
    runner = LearnerRunner(config(tmp_path, 2), learner, dead_letters=writer(producer))
    with pytest.raises(DeliveryError, match=f"dead letters to {DLQ}: 1 refused"):
        runner.run()
    assert learner.trained == [] and runner.positions == {Partition(TOPIC, 0): 0}
    assert SnapshotStore(tmp_path).versions() == []


def test_a_micro_batch_of_only_dead_letters_moves_the_positions_into_a_snapshot(
    tmp_path: Path, script: Callable[..., ScriptedConsumer]
) -> None:
    script([[b"[]", b"null", b"{}"]])
    producer = FakeProducer()
    learner = ScriptedLearner([])
    stats = LearnerRunner(config(tmp_path, 3), learner, dead_letters=writer(producer)).run()
    assert (stats.micro_batches, stats.samples_trained, stats.dead) == (0, 0, 3)
    assert learner.trained == []
    manifest = SnapshotStore(tmp_path).latest()
    assert manifest is not None and [p.offset for p in manifest.positions] == [3]


def test_max_bad_batches_in_a_row_stop_the_learner_and_a_good_one_resets_the_count(
    tmp_path: Path, script: Callable[..., ScriptedConsumer], caplog: pytest.LogCaptureFixture
) -> None:
    script([[valid(2 * k), valid(2 * k + 1)] for k in range(6)])
    learner = ScriptedLearner([BAD, BAD, GOOD, BAD, BAD, BAD])
    runner = LearnerRunner(config(tmp_path, 2, max_bad_batches=3), learner)
    with caplog.at_level(logging.WARNING, logger="streamrec.learner"):
        with pytest.raises(TrainingDiverged, match="not finite in 3 micro-batches in a row"):
            runner.run()
    assert (runner.stats.micro_batches, runner.stats.bad_batches) == (6, 5)
    assert runner.stats.skipped_steps == 5
    assert "bad micro_batch index=6 skipped_steps=1 steps=2 bad_in_row=3 max_bad_batches=3" in caplog.text
    assert SnapshotStore(tmp_path).versions() == []  # stopped without snapshotting them


def test_a_snapshot_of_non_finite_weights_is_refused(
    tmp_path: Path, script: Callable[..., ScriptedConsumer]
) -> None:
    script([])
    for key, value in (("model/w", np.nan), ("optimizer/w/moment1", np.inf)):
        learner = ScriptedLearner([])
        learner.arrays[key][1] = value
        with LearnerRunner(config(tmp_path, 2), learner) as runner:
            expected = f"1 state arrays hold NaN or infinite values \\({key}\\)"
            with pytest.raises(NonFiniteWeights, match=expected):
                runner.snapshot()
    assert SnapshotStore(tmp_path).versions() == []
    with LearnerRunner(config(tmp_path, 2), ScriptedLearner([])) as runner:
        runner.snapshot()  # integer arrays are not checked, finite floats pass
    assert SnapshotStore(tmp_path).versions() == [1]


def test_a_nan_producing_din_keeps_its_weights_and_writes_no_snapshot(
    tmp_path: Path, script: Callable[..., ScriptedConsumer]
) -> None:
    """A NaN weight (as a poisoned step once left) makes every loss NaN: each step is skipped,
    the weights stay exactly as they were, the learner stops after max_bad_batches, and the
    final snapshot is never written.
    """
    script([[valid(10 * k + i) for i in range(10)] for k in range(3)])
    learner = DINLearner(SMALL_MODEL)
    arrays = learner.state_arrays()
    arrays["model/model.head.mlp.0.weight"][0, 0] = np.nan
    learner.load_state_arrays(arrays)
    before = learner.state_arrays()
    runner = LearnerRunner(config(tmp_path, 10, max_bad_batches=2), learner)
    with pytest.raises(TrainingDiverged):
        runner.run()
    assert runner.stats.micro_batches == 2 and runner.stats.skipped_steps == 2
    after = learner.state_arrays()
    for key in before:
        if key.startswith(("model/model.", "optimizer/")):  # the id statistics count data
            np.testing.assert_array_equal(after[key], before[key], err_msg=key)
    assert SnapshotStore(tmp_path).versions() == []
    with LearnerRunner(config(tmp_path, 10), learner) as again, pytest.raises(NonFiniteWeights):
        again.snapshot()


def test_the_cli_report_line_names_dead_letters_and_skipped_steps(
    capsys: pytest.CaptureFixture[str],
) -> None:
    metrics = MicroBatchMetrics.compute(
        np.array([0, 1]), np.array([0.2, 0.7]), np.array(["u", "u"]), np.zeros(2)
    )
    print_report(MicroBatchReport(3, metrics, TS, TS, 0.4, 0.1, 0.2))
    clean = capsys.readouterr().out
    assert "micro-batch    3" in clean and "dead-lettered" not in clean and "skipped" not in clean
    print_report(MicroBatchReport(4, metrics, TS, TS, 0.4, 0.1, 0.2, dead=2, steps=8, skipped_steps=3))
    assert "dead-lettered 2  skipped 3/8 non-finite steps" in capsys.readouterr().out


def test_a_snapshot_resuming_at_expired_samples_is_refused_or_skipped_when_allowed(
    tmp_path: Path, script: Callable[..., ScriptedConsumer], caplog: pytest.LogCaptureFixture
) -> None:
    """Retention deleted samples the newest snapshot had not trained: the consumer would jump
    to the earliest offset left without a word.
    """
    script([[valid(0), valid(1)]])
    LearnerRunner(config(tmp_path, 2), ScriptedLearner([GOOD])).run()  # snapshot at offset 2
    script([]).earliest = 7
    with pytest.raises(SamplesExpired, match=r"samples\[0\] at 2 \(it starts at 7\); 5 samples"):
        LearnerRunner(config(tmp_path, 2), ScriptedLearner([])).run()
    script([]).earliest = 7
    runner = LearnerRunner(config(tmp_path, 2, allow_sample_gaps=True), ScriptedLearner([]))
    with caplog.at_level(logging.WARNING, logger="streamrec.learner"):
        runner.run()
    assert runner.positions == {Partition(TOPIC, 0): 7}
    assert "skipping expired samples count=5" in caplog.text


def test_a_samples_topic_created_again_while_the_learner_runs_is_never_snapshotted(
    tmp_path: Path, script: Callable[..., ScriptedConsumer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The positions would mix offsets of two topics: the snapshot is refused, and a restart
    decides (tests/integration/learner/test_recreated_topic.py, on the real broker).
    """
    ids = iter(["old", "new"])
    monkeypatch.setattr(progress, "topic_id", lambda *_, **__: next(ids))
    script([[valid(0), valid(1)]])
    with pytest.raises(SamplesTopicRecreated, match="created again while the learner ran .*old, now new"):
        LearnerRunner(config(tmp_path, 2), ScriptedLearner([GOOD])).run()
    assert SnapshotStore(tmp_path).versions() == []


def test_a_micro_batch_too_small_to_judge_is_reported_as_such(
    tmp_path: Path, script: Callable[..., ScriptedConsumer], capsys: pytest.CaptureFixture[str],
) -> None:
    """The demo's last micro-batch held 4 samples and printed `AUC nan GAUC nan` as figures."""
    script([[valid(n) for n in range(6)], [valid(6), valid(7)]])
    reports: list[MicroBatchReport] = []
    runner = LearnerRunner(
        config(tmp_path, 6, min_eval_samples=5), DINLearner(SMALL_MODEL), on_report=reports.append
    )
    runner.run()
    assert [(r.metrics.samples, r.judged) for r in reports] == [(6, True), (2, False)]
    print_report(reports[1])
    out = capsys.readouterr().out
    assert "too small to judge (2 samples < STREAMREC_LEARNER__MIN_EVAL_SAMPLES 5)" in out
    assert "AUC" not in out


def test_a_micro_batch_of_first_clicks_only_trains(
    tmp_path: Path, script: Callable[..., ScriptedConsumer]
) -> None:
    """Every user's first click has no history: the report's match features are zeros (once a
    numpy casting error that stopped the learner when no sample of a micro-batch had a history).
    """
    first = [Sample(f"s{n}", f"u{n}", TS + n, f"i{n}", "c1", n % 2, (), ()).to_json() for n in range(2)]
    script([first])
    learner = ScriptedLearner([])
    stats = LearnerRunner(config(tmp_path, 2), learner).run()
    assert learner.trained == ["s0", "s1"] and stats.micro_batches == 1


class ScoresNaN(ScriptedLearner):
    """A user's learner whose scores are NaN while its training reports nothing wrong."""

    def predict_many(self, batch: SampleColumns) -> np.ndarray:
        return np.full(len(batch), np.nan)


def test_nan_scores_from_a_learner_whose_steps_were_fine_stop_the_loop_in_one_line(
    tmp_path: Path, script: Callable[..., ScriptedConsumer]
) -> None:
    """Noted by the model tour: such a learner ran on with AUC 0.55 and GAUC 0.45 reported of NaN.

    NaN scores with skipped steps are a model gone non-finite, left to the divergence guard
    (the test above).
    """
    from streamrec.errors import LearnerContractError

    script([[valid(i) for i in range(10)]])
    runner = LearnerRunner(config(tmp_path, 10), ScoresNaN([]))
    with pytest.raises(LearnerContractError, match="predict_many returned 10 of 10 scores not finite"):
        runner.run()
    assert runner.stats.micro_batches == 0 and SnapshotStore(tmp_path).versions() == []


class RaisingLearner(ScriptedLearner):
    """A user's learner with a bug of its own in ``learn_many``."""

    def learn_many(self, batch: SampleColumns) -> TrainResult:
        raise ValueError("the user's own bug")


def test_a_learner_raising_in_its_own_code_is_named_with_its_frames(
    tmp_path: Path, script: Callable[..., ScriptedConsumer]
) -> None:
    # as in a backtest (unit replay/test_learner_raises): it was a raw traceback
    script([[valid(0), valid(1)]])
    runner = LearnerRunner(config(tmp_path, 2), RaisingLearner([]))
    said = (r"^learner tests.unit.learner.test_runner_guards:RaisingLearner: learn_many raised ValueError: "
            r"the user's own bug \(learner run, micro-batch 1\)$")
    with pytest.raises(LearnerFailed, match=said) as err:
        runner.run()
    assert "in learn_many" in err.value.frames and "runner.py" not in err.value.frames
    assert runner.positions == {Partition(TOPIC, 0): 0}  # nothing trained moved them
    assert SnapshotStore(tmp_path).versions() == []
