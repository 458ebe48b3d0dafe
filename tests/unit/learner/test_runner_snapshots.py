"""LearnerRunner and its snapshot directory: one runner per directory, checked before any
training, resumed from the newest valid version. The Kafka consumer is a stand-in: nothing
here reaches a broker.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from streamrec.config import StreamrecConfig
from streamrec.errors import InvalidSnapshot, SnapshotDirError, SnapshotError, SnapshotInUse
from streamrec.kafka.records import Partition, Position
from streamrec.learner import runner as runner_module
from streamrec.learner import snapshotting
from streamrec.learner.base import TrainResult
from streamrec.learner.columns import SampleColumns
from streamrec.learner.din import DINLearner
from streamrec.learner.runner import LearnerRunner
from streamrec.snapshots.store import SnapshotStore


class StubLearner:
    """A learner whose state is two small arrays; training it fails the test."""

    def __init__(self, value: float = 0.0) -> None:
        self.arrays: dict[str, np.ndarray] = {
            "model/w": np.full(4, value, np.float32), "state/n": np.arange(3),
        }
        self.loaded: list[float] = []

    def predict_many(self, batch: SampleColumns) -> np.ndarray:
        raise AssertionError("scored")

    def learn_many(self, batch: SampleColumns) -> TrainResult:
        raise AssertionError("trained")

    def is_known(self, batch: SampleColumns) -> np.ndarray:
        raise AssertionError("scored")

    def state_arrays(self) -> dict[str, np.ndarray]:
        return dict(self.arrays)

    def load_state_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.arrays = dict(arrays)
        self.loaded.append(float(arrays["model/w"][0]))


class FakeConsumer:
    """What the runner touches of a consumer when it starts and stops."""

    def __init__(self) -> None:
        self.closed = 0

    def subscribe(self, topics: list[str], **callbacks: object) -> None:
        pass

    def close(self) -> None:
        self.closed += 1

    def commit(self, **_: object) -> None:
        pass

    def list_topics(self, topic: str, timeout: float) -> SimpleNamespace:
        return SimpleNamespace(topics={})  # no partitions to give a start position


@pytest.fixture
def consumers(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[FakeConsumer]]:
    """Every consumer the runners made, in order."""
    made: list[FakeConsumer] = []

    def make(*_: object, **__: object) -> FakeConsumer:
        made.append(FakeConsumer())
        return made[-1]

    monkeypatch.setattr(runner_module, "make_consumer", make)
    yield made


def config(snapshot_dir: Path) -> StreamrecConfig:
    return StreamrecConfig.model_validate({"learner": {"snapshot_dir": snapshot_dir}})


def test_a_second_runner_on_the_directory_is_refused_until_the_first_closes(
    tmp_path: Path, consumers: list[FakeConsumer]
) -> None:
    first = LearnerRunner(config(tmp_path), StubLearner())
    with pytest.raises(SnapshotInUse, match=f"{tmp_path} is in use by pid {os.getpid()} on host"):
        LearnerRunner(config(tmp_path), StubLearner())
    assert len(consumers) == 1  # refused before it made a consumer
    first.close()
    first.close()  # twice is harmless
    assert consumers[0].closed == 1
    with LearnerRunner(config(tmp_path), StubLearner()):
        with pytest.raises(SnapshotInUse):
            LearnerRunner(config(tmp_path), StubLearner())
    LearnerRunner(config(tmp_path), StubLearner()).close()


def test_run_releases_the_directory_when_it_ends(
    tmp_path: Path, consumers: list[FakeConsumer]
) -> None:
    runner = LearnerRunner(config(tmp_path), StubLearner())
    stop = threading.Event()
    stop.set()
    runner.run(stop)
    assert consumers[0].closed == 1
    LearnerRunner(config(tmp_path), StubLearner()).close()
    with pytest.raises(RuntimeError, match="closed"):
        runner.snapshot()


def test_a_file_as_snapshot_directory_fails_at_start(
    tmp_path: Path, consumers: list[FakeConsumer]
) -> None:
    path = tmp_path / "snapshots"
    path.write_text("")
    with pytest.raises(SnapshotDirError, match=f"snapshot directory {path} is not a directory"):
        LearnerRunner(config(path), StubLearner())  # StubLearner fails the test if trained
    assert consumers == []


def test_too_little_space_for_two_snapshots_fails_at_start(
    tmp_path: Path, consumers: list[FakeConsumer]
) -> None:
    learner = StubLearner()
    size = sum(a.nbytes for a in learner.state_arrays().values())
    tight = SnapshotStore(tmp_path, free_bytes=lambda _: 2 * size)  # no room for the headroom
    with pytest.raises(SnapshotDirError, match="free some space"):
        LearnerRunner(config(tmp_path), learner, snapshots=tight)
    assert consumers == []
    roomy = SnapshotStore(tmp_path, free_bytes=lambda _: 10 * size + (1 << 20))
    LearnerRunner(config(tmp_path), learner, snapshots=roomy).close()  # and the lock was freed


def test_start_removes_leftovers_and_resumes_from_the_newest_valid_version(
    tmp_path: Path, consumers: list[FakeConsumer]
) -> None:
    store = SnapshotStore(tmp_path)
    for value, offset in ((1.0, 10), (2.0, 20)):
        grouped: dict[str, dict[str, np.ndarray]] = {
            "model": {"w": np.full(4, value, np.float32)}, "state": {"n": np.arange(3)},
        }
        positions = (Position("s", 0, offset),)
        store.write(grouped, micro_batches=int(value), samples_trained=5, positions=positions)
    manifest = store.path(2) / "manifest.json"
    manifest.write_bytes(manifest.read_bytes().replace(b'"offset": 20', b'"offset": 29'))
    (tmp_path / ".tmp-killed").mkdir()
    learner = StubLearner()
    with LearnerRunner(config(tmp_path), learner) as runner:
        assert learner.loaded == [1.0]
        assert runner.positions == {Partition("s", 0): 10}
        assert runner.stats.micro_batches == 1
    assert not (tmp_path / ".tmp-killed").exists()


def test_no_valid_version_is_refused_not_a_fresh_start(tmp_path: Path, consumers: list[FakeConsumer]) -> None:
    """It started a new model at the group's committed offset, dropping what the versions trained."""
    (tmp_path / "v000009").mkdir()
    learner = StubLearner()
    with pytest.raises(InvalidSnapshot, match=r"no snapshot in .* loads: v000009 failed .*move it aside"):
        LearnerRunner(config(tmp_path), learner)
    assert learner.loaded == []
    with LearnerRunner(config(tmp_path / "new"), learner) as runner:  # an empty directory starts fresh
        assert learner.loaded == [] and runner.positions == {} and runner.stats.micro_batches == 0


def test_the_space_check_counts_the_exports(tmp_path: Path, consumers: list[FakeConsumer]) -> None:
    learner = StubLearner()
    size = sum(a.nbytes for a in learner.state_arrays().values())
    export = tmp_path / "exports" / "v000001"
    export.mkdir(parents=True)
    (export / "model.pdiparams").write_bytes(bytes(3 << 20))  # the newest export: 3 MB
    headroom = 1 << 20
    enough_for_snapshots = 10 * size + 2 * headroom  # but not for two exports beside them
    tight = SnapshotStore(tmp_path, free_bytes=lambda _: enough_for_snapshots)
    with pytest.raises(SnapshotDirError, match=r"2 snapshots of .* and their exports of 3\.1 MB"):
        LearnerRunner(config(tmp_path), learner, snapshots=tight)
    roomy = SnapshotStore(tmp_path, free_bytes=lambda _: enough_for_snapshots + 2 * (3 << 20))
    LearnerRunner(config(tmp_path), learner, snapshots=roomy).close()


def test_a_snapshot_request_with_nothing_trained_since_answers_with_the_newest_version(
    tmp_path: Path, consumers: list[FakeConsumer]
) -> None:
    store = SnapshotStore(tmp_path)
    store.write({"model": {"w": np.ones(4, np.float32)}, "state": {"n": np.arange(3)}},
                micro_batches=1, samples_trained=5, positions=(Position("s", 0, 10),))
    with LearnerRunner(config(tmp_path), StubLearner()) as runner:
        request = store.requests.request()
        runner._serve_requests()
        assert store.versions() == [1]  # no empty version written
        assert store.requests.pending() == [] and store.requests.answered(request) == 1
        runner.positions[Partition("s", 0)] = 12  # dead letters passed: that is news
        request = store.requests.request()
        runner._serve_requests()
        assert store.versions() == [1, 2] and store.find_request(request) == store.manifest(2)
        request = store.requests.request()
        runner._serve_requests()
        assert store.versions() == [1, 2] and store.requests.answered(request) == 2


def test_a_snapshot_of_another_model_layout_names_the_settings_that_differ(
    tmp_path: Path, consumers: list[FakeConsumer]
) -> None:
    """A snapshot written before the match features (or with other model settings) failed to
    resume with `state arrays do not fit this model: missing=[...]`, naming no setting.
    """
    from tests.support import small_tables

    model = {"tables": small_tables(512, 64, dim=4), "sequence_length": 6, "mlp_units": (8,)}
    old = StreamrecConfig.model_validate({
        "learner": {"snapshot_dir": tmp_path}, "model": {**model, "match_features": False},
    })
    with LearnerRunner(old, DINLearner(old.model)) as runner:
        runner.snapshot()
    new = StreamrecConfig.model_validate({"learner": {"snapshot_dir": tmp_path}, "model": model})
    with pytest.raises(SnapshotError) as caught:
        LearnerRunner(new, DINLearner(new.model))
    message = str(caught.value)
    assert "v000001" in message and "STREAMREC_MODEL__MATCH_FEATURES=false" in message
    assert "\n" not in message


def test_a_snapshot_resumed_under_other_model_settings_says_which(
    tmp_path: Path, consumers: list[FakeConsumer], caplog: pytest.LogCaptureFixture
) -> None:
    """Resumed with STREAMREC_MODEL__SEQUENCE_LENGTH=20 over snapshots written at 50, a learner
    loaded them (the tensors fit) and trained on without a word (found by the operating tour).
    """
    from tests.support import small_tables

    model = {"tables": small_tables(512, 64, dim=4), "sequence_length": 6, "mlp_units": (8,)}
    old = StreamrecConfig.model_validate({"learner": {"snapshot_dir": tmp_path}, "model": model})
    with LearnerRunner(old, DINLearner(old.model)) as runner:
        runner.snapshot()
    with caplog.at_level("WARNING", logger=snapshotting.__name__), LearnerRunner(old, DINLearner(old.model)):
        pass
    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == snapshotting.__name__ and r.levelno >= 30]

    assert not said()  # the same settings: nothing to say
    changed = {**model, "sequence_length": 4, "seed": 7, "learning_rate": 0.01}
    new = StreamrecConfig.model_validate({"learner": {"snapshot_dir": tmp_path}, "model": changed})
    with caplog.at_level("WARNING", logger=snapshotting.__name__), LearnerRunner(new, DINLearner(new.model)):
        pass
    [line] = said()
    assert "v000001" in line and "STREAMREC_MODEL__SEQUENCE_LENGTH=6 (now 4)" in line
    assert "STREAMREC_MODEL__LEARNING_RATE=0.001 (now 0.01)" in line and "SEED" not in line


def test_a_snapshot_with_the_former_default_tables_names_the_tables_setting_that_resumes_it(
    tmp_path: Path, consumers: list[FakeConsumer]
) -> None:
    """The category table became hashed by default (and the match head's starting weight 1):
    a snapshot written with the former default, a dynamic category table, must be refused in
    one line naming the STREAMREC_MODEL__TABLES that reproduces it, and not the starting
    weight, which a snapshot overrides.
    """
    before = [
        {"name": "item", "feature": "item", "rows": 2**21, "dim": 16},
        {"name": "category", "feature": "category", "rows": 2**16, "dim": 16},
    ]
    small = {"sequence_length": 6, "attention_units": (4,), "mlp_units": (8,)}
    old = StreamrecConfig.model_validate({
        "learner": {"snapshot_dir": tmp_path},
        "model": {**small, "tables": before, "match_init": 0.0},
    })
    assert old.model.tables[1].ids == "dynamic"
    with LearnerRunner(old, DINLearner(old.model)) as runner:
        runner.snapshot()
    new = StreamrecConfig.model_validate({"learner": {"snapshot_dir": tmp_path}, "model": small})
    assert new.model.tables[1].ids == "hashed" and new.model.match_init == 1.0
    with pytest.raises(SnapshotError) as caught:
        LearnerRunner(new, DINLearner(new.model))
    message = str(caught.value)
    saved = json.dumps(old.model.model_dump(mode="json")["tables"])
    assert f"STREAMREC_MODEL__TABLES={saved} (now " in message
    assert "MATCH_INIT" not in message and "\n" not in message
    resumed = StreamrecConfig.model_validate({
        "learner": {"snapshot_dir": tmp_path}, "model": {**small, "tables": json.loads(saved)},
    })
    LearnerRunner(resumed, DINLearner(resumed.model)).close()


@pytest.mark.parametrize("onnx", [True, False], ids=["onnx", "paddle-only"])
def test_before_any_export_the_estimate_counts_the_onnx_graph_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, onnx: bool
) -> None:
    """Found by the faults tour (test first): on a fresh directory the start-up check took an
    export for the model's parameters (13.8 MB), but with the ``onnx`` extra an export holds them
    again in ``model.onnx`` (18.6 MB beside 13.8, 32 MB in all): a directory with 80 MB
    free passed the check and every export from the fifth failed with No space left on device.
    """
    monkeypatch.setattr(snapshotting, "onnx_missing", lambda: [] if onnx else ["onnxruntime"])
    arrays = {"model/w": np.ones(1000, np.float32), "optimizer/m": np.ones(1000, np.float32)}
    assert snapshotting.export_estimate(tmp_path, arrays) == (9600 if onnx else 4000)


def test_a_setting_recorded_before_a_field_of_it_existed_is_not_a_change() -> None:
    """Found by the upgrades tour: a learner of this release resuming a 2026-12-01 snapshot with
    the settings docs/operating/upgrades.md gives (its tables, match features off) warned that it
    was trained with other model settings, STREAMREC_MODEL__TABLES, then and now the same but for
    the tables' ``also`` (added since, its default ``[]``), which that release did not record.
    """
    recorded = [  # the model.tables of a manifest that release wrote (no "also")
        {"name": "item", "feature": "item", "ids": "dynamic", "rows": 2097152, "dim": 16,
         "min_count": 1, "ttl_s": None, "initial_rows": 4096},
        {"name": "category", "feature": "category", "ids": "dynamic", "rows": 65536, "dim": 16,
         "min_count": 1, "ttl_s": None, "initial_rows": 4096},
    ]
    as_documented = [
        {"name": "item", "feature": "item", "rows": 2097152},
        {"name": "category", "feature": "category", "rows": 65536},
    ]
    cfg = StreamrecConfig.model_validate({"model": {"tables": as_documented, "match_features": False}})
    manifest = SimpleNamespace(config={"model": {"tables": recorded, "sequence_length": 50}})
    assert snapshotting.changed_settings(cfg, manifest) == []  # type: ignore[arg-type]  # a stand-in
    shorter = {"model": {"tables": recorded, "sequence_length": 20}}
    [line] = snapshotting.changed_settings(cfg, SimpleNamespace(config=shorter))  # type: ignore[arg-type]
    assert line == "STREAMREC_MODEL__SEQUENCE_LENGTH=20 (now 50)"
    other = [recorded[0], {**recorded[1], "ids": "hashed"}]
    [line] = snapshotting.changed_settings(cfg, SimpleNamespace(config={"model": {"tables": other}}))  # type: ignore[arg-type]
    assert line.startswith('STREAMREC_MODEL__TABLES=[{"name": "item"') and '"hashed"' in line
