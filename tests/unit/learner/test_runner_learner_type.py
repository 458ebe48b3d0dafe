"""A learner chosen by configuration trains and snapshots through the loop; snapshots record
its type, and a resume under another type is refused before anything is consumed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from streamrec.config import StreamrecConfig
from streamrec.errors import ConfigError, NotExportable
from streamrec.learner import runner as runner_module
from streamrec.learner.registry import make_learner
from streamrec.learner.runner import LearnerRunner
from streamrec.snapshots.manifest import SnapshotManifest
from streamrec.snapshots.store import SnapshotStore
from tests.unit.learner.test_runner_guards import FakeProducer, ScriptedConsumer, config, valid, writer
from tests.unit.learner.tiny_learner import (
    CLASS_PATH,
    CONTRACTLESS_PATH,
    EXPORTABLE_PATH,
    OWN_INPUTS_PATH,
    TinyLearner,
)


def tiny_config(tmp_path: Path, class_path: str = CLASS_PATH) -> StreamrecConfig:
    cfg = config(tmp_path, 3)
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"learner": class_path})})


def run_tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, class_path: str = CLASS_PATH) -> TinyLearner:
    consumer = ScriptedConsumer([[valid(n) for n in range(6)]])
    monkeypatch.setattr(runner_module, "make_consumer", lambda *_, **__: consumer)
    cfg = tiny_config(tmp_path, class_path)
    learner = make_learner(cfg.model)
    assert isinstance(learner, TinyLearner)
    LearnerRunner(cfg, learner, dead_letters=writer(FakeProducer())).run()
    return learner


def newest(tmp_path: Path) -> tuple[SnapshotStore, SnapshotManifest]:
    """The snapshot directory and its newest version."""
    store = SnapshotStore(tmp_path)
    manifest = store.latest()
    assert manifest is not None
    return store, manifest


def test_a_configured_learner_trains_and_its_snapshot_records_its_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    learner = run_tiny(tmp_path, monkeypatch)
    assert learner.counts[1] == 6
    manifest = SnapshotStore(tmp_path).latest()
    assert manifest is not None and manifest.samples_trained == 6
    assert manifest.learner == CLASS_PATH
    resumed = make_learner(tiny_config(tmp_path).model)
    monkeypatch.setattr(runner_module, "make_consumer", lambda *_, **__: ScriptedConsumer([]))
    LearnerRunner(tiny_config(tmp_path), resumed, dead_letters=writer(FakeProducer())).close()
    assert isinstance(resumed, TinyLearner)
    np.testing.assert_array_equal(resumed.counts, learner.counts)


def test_resuming_under_another_learner_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_tiny(tmp_path, monkeypatch)
    made: list[object] = []
    monkeypatch.setattr(runner_module, "make_consumer", lambda *_, **__: made.append(1))
    with pytest.raises(ConfigError) as info:
        LearnerRunner(config(tmp_path, 3), TinyLearner(), dead_letters=writer(FakeProducer()))
    message = str(info.value)
    assert "\n" not in message
    assert "STREAMREC_MODEL__LEARNER" in message
    assert f"'{CLASS_PATH}'" in message and "'din'" in message
    assert made == []  # refused before it made a consumer
    monkeypatch.setattr(runner_module, "make_consumer", lambda *_, **__: ScriptedConsumer([]))
    LearnerRunner(tiny_config(tmp_path), TinyLearner(), dead_letters=writer(FakeProducer())).close()


@pytest.mark.parametrize("config_doc", [{}, {"model": {}}, {"model": {"learner": None}}])
def test_a_manifest_from_before_the_setting_reads_as_din(config_doc: dict[str, object]) -> None:
    manifest = SnapshotManifest(1, "2026-01-01T00:00:00+00:00", 1, 1, (), config=config_doc)
    assert manifest.learner == "din"


def test_a_learner_without_an_exporter_is_refused_by_export_and_the_gate_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from streamrec.serving.export import export_snapshot
    from streamrec.serving.gate import Promoter

    run_tiny(tmp_path, monkeypatch)
    store, manifest = newest(tmp_path)
    with pytest.raises(NotExportable) as info:
        export_snapshot(store, manifest.version)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"learner {CLASS_PATH} cannot be exported for serving: ")
    Promoter(store, tiny_config(tmp_path).learner).on_snapshot(manifest)  # logs, trains on
    assert f"learner {CLASS_PATH} cannot be exported for serving" in caplog.text
    assert not (tmp_path / "exports" / manifest.name).exists()


def test_a_learner_that_exports_itself_is_exported_with_its_contract(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamrec.serving.export import export_snapshot, verify_export

    learner = run_tiny(tmp_path, monkeypatch, EXPORTABLE_PATH)
    store, manifest = newest(tmp_path)
    assert manifest.learner == EXPORTABLE_PATH
    path = export_snapshot(store, manifest.version)
    assert {"rate.npy", "contract.json"} <= set(verify_export(path))
    expected = (learner.counts[0] + learner.prior) / (learner.counts[1] + 1.0)
    assert np.load(path / "rate.npy", allow_pickle=False)[0] == pytest.approx(expected)


def test_an_export_without_a_scoring_contract_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamrec.serving.export import export_snapshot

    run_tiny(tmp_path, monkeypatch, CONTRACTLESS_PATH)
    store, manifest = newest(tmp_path)
    refused = f"learner {CONTRACTLESS_PATH} cannot be exported for serving: .*contract.json"
    with pytest.raises(NotExportable, match=refused):
        export_snapshot(store, manifest.version)
    assert not (tmp_path / "exports" / manifest.name).exists()


def test_serving_refuses_another_learners_export_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamrec.errors import SnapshotError
    from streamrec.serving.export import export_snapshot
    from streamrec.serving.scorer import ExportedModel

    run_tiny(tmp_path, monkeypatch, EXPORTABLE_PATH)
    store, manifest = newest(tmp_path)
    path = export_snapshot(store, manifest.version)
    with pytest.raises(SnapshotError) as info:  # the gate holds a promotion on it, serve exits
        ExportedModel(path)
    message = str(info.value)
    assert "\n" not in message
    assert f"{path}" in message and "contract.json" in message


def test_an_export_whose_own_contract_lists_inputs_is_whole_and_refused_by_serving_as_not_servable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Noted by the model tour: a learner's own contract with an ``inputs`` list was judged by the
    table models' form, so its export read as damaged ("has no int 'sequence_length'") and the
    promotion said to rebuild it, which rebuilt the same.
    """
    from streamrec.errors import NotServable
    from streamrec.serving.export import export_snapshot
    from streamrec.serving.scorer import ExportedModel
    from streamrec.snapshots.exports import check_export

    run_tiny(tmp_path, monkeypatch, OWN_INPUTS_PATH)
    store, manifest = newest(tmp_path)
    path = export_snapshot(store, manifest.version)
    assert check_export(tmp_path, manifest.version).whole
    with pytest.raises(NotServable, match="cannot be served by streamrec: .*score it as its contract.json"):
        ExportedModel(path)


def gate_warnings(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "streamrec.serving.gate"]


def test_the_gate_says_once_as_a_warning_that_a_learner_without_an_exporter_is_not_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Noted by a tour: a learner of one's own with no export logged an ERROR (``export failed``)
    at every snapshot of a run that was doing what it was told. Once, a WARNING that says what it
    means: nothing exported or promoted, nothing for `streamrec serve`, and what serves it.
    """
    from streamrec.serving.gate import Promoter

    run_tiny(tmp_path, monkeypatch)
    store, manifest = newest(tmp_path)
    caplog.clear()
    gate = Promoter(store, tiny_config(tmp_path).learner)
    for _ in range(3):  # a snapshot each
        gate.on_snapshot(manifest)
    [(level, message)] = gate_warnings(caplog)
    assert level == "WARNING"
    assert message.startswith(f"learner {CLASS_PATH} cannot be exported for serving: ")
    assert "no version is exported or promoted, so `streamrec serve` has none to serve" in message
    assert "export_for_serving(directory, version)" in message and "said once" in message
    assert store.current() is None and store.history() == []


def test_the_gate_promotes_no_version_of_an_export_serve_does_not_load_and_says_so_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Noted by a tour: the gate promoted the first version of a learner exporting its own
    contract (which `streamrec serve` refuses), then logged an ERROR (``cannot load the served
    version``) and a WARNING (``promotion held``) at every snapshot after, forever.
    """
    from streamrec.serving.gate import Promoter

    run_tiny(tmp_path, monkeypatch, EXPORTABLE_PATH)
    store, manifest = newest(tmp_path)
    caplog.clear()
    gate = Promoter(store, tiny_config(tmp_path, EXPORTABLE_PATH).learner)
    for _ in range(3):
        gate.on_snapshot(manifest)
    [(level, message)] = gate_warnings(caplog)
    assert level == "WARNING" and message.startswith(f"{EXPORTABLE_PATH}'s exports are its own")
    assert "cannot be served by streamrec" in message and "--own-server" in message
    assert store.current() is None and gate.pending is None
    assert (tmp_path / "exports" / manifest.name / "contract.json").is_file()  # exported all the same
    caplog.clear()
    resumed = Promoter(store, tiny_config(tmp_path, EXPORTABLE_PATH).learner)  # the next run
    resumed.resume(manifest)  # the version resumed from, promoted unjudged with nothing served
    [(level, message)] = gate_warnings(caplog)
    assert level == "WARNING" and message.startswith(f"{EXPORTABLE_PATH}'s exports are its own")
    assert store.current() is None


def with_nan_weights(store: SnapshotStore, version: int) -> None:
    """Write NaN into a version's model file and reseal its checksums, as a hand or a tool could."""
    import hashlib

    from safetensors.numpy import save_file

    from tests.unit.snapshots.test_snapshot_safety import forge

    path = store.path(version) / "model.safetensors"
    save_file({"counts": np.array([np.nan, 6.0])}, str(path))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    forge(store, version, {**store.manifest(version).files, path.name: digest})


def test_a_snapshot_resealed_with_nan_weights_is_neither_exported_nor_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Noted by a tour: NaN weights are never written, but a version whose file was edited and
    resealed passed `snapshot verify`, was exported and promoted, and `streamrec score` answered
    ``nan`` for every item. The state is refused where it is read, naming the array.
    """
    from typer.testing import CliRunner

    from streamrec.cli import app
    from streamrec.errors import InvalidSnapshot, SnapshotError
    from streamrec.serving.export import export_snapshot

    run_tiny(tmp_path, monkeypatch, EXPORTABLE_PATH)
    store, manifest = newest(tmp_path)
    with_nan_weights(store, manifest.version)
    assert store.validate(manifest.version) is None  # its checksums hold
    refused = "its state holds NaN or infinite values in model/counts, which streamrec never writes"
    with pytest.raises(InvalidSnapshot, match=refused):
        export_snapshot(store, manifest.version)
    args = ["snapshot", "promote", str(manifest.version), "--snapshot-dir", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1 and refused in result.output and store.current() is None
    monkeypatch.setattr(runner_module, "make_consumer", lambda *_, **__: ScriptedConsumer([]))
    cfg = tiny_config(tmp_path, EXPORTABLE_PATH)
    with pytest.raises(SnapshotError, match=f"snapshot {manifest.name} in {tmp_path}: {refused}"):
        LearnerRunner(cfg, TinyLearner(), dead_letters=writer(FakeProducer()))
