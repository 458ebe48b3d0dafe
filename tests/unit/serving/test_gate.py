"""Automatic promotion: a version trained on a corrupted window is held, the pointer stays."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
import pytest

from streamrec.config import LearnerConfig
from streamrec.learner.columns import SampleColumns
from streamrec.learner.din import DINLearner
from streamrec.learner.snapshotting import group_state
from streamrec.samples import Sample
from streamrec.serving.export import export_dir, export_snapshot
from streamrec.serving.gate import Promoter, judge
from streamrec.snapshots.store import SnapshotManifest, SnapshotStore
from tests.unit.serving.test_export import config


def window(n: int, seed: int, ts: int) -> SampleColumns:
    """Even items are liked 9 times in 10, odd ones once: a signal a few windows learn."""
    rng = np.random.default_rng(seed)
    samples = []
    for k in range(n):
        user, item = f"u{rng.integers(50)}", int(rng.integers(40))
        label = int((item % 2 == 0) == (rng.random() < 0.9))
        samples.append(Sample(f"s{seed}-{k}", user, ts + k, f"i{item}", f"c{item % 5}", label, (), ()))
    return SampleColumns.from_samples(samples)


def flip(batch: SampleColumns, share: float, seed: int) -> SampleColumns:
    flipped = np.random.default_rng(seed).random(len(batch)) < share
    label = np.where(flipped, 1 - batch.label, batch.label).astype(np.float32)
    return dataclasses.replace(batch, label=label)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_version_trained_on_flipped_labels_is_not_promoted(tmp_path: Path, seed: int) -> None:
    store = SnapshotStore(tmp_path)
    cfg = config(seed=seed)
    learner = DINLearner(cfg)
    promoter = Promoter(store, LearnerConfig())
    judgements = {}
    for k in range(5):
        batch = window(1000, 100 * seed + k, k * 100_000)
        before = store.current()
        judgement = promoter.on_scored(batch, learner.predict_many(batch))  # as the runner does
        judgements[k] = (judgement, before, store.current())
        learner.learn_many(flip(batch, 0.3, seed) if k == 3 else batch)
        manifest = store.write(
            group_state(learner.state_arrays()), micro_batches=k + 1, samples_trained=0, positions=(),
            config={"model": cfg.model_dump(mode="json")},
        )
        promoter.on_snapshot(manifest)
        assert export_dir(tmp_path, manifest.version).is_dir()
    assert store.promoted()[0] == 1  # the first version: nothing to hold it against
    held, before, after = judgements[4]  # version 4, trained on the flipped window
    assert held is not None and held.candidate == 4 and not held.passed
    assert "logloss" in held.reason
    assert before == after != 4
    assert 4 not in store.promoted()


def test_the_gate_rules() -> None:
    labels = np.array([0, 1, 0, 1, 1, 0], np.float32)
    good = np.array([0.2, 0.8, 0.3, 0.7, 0.9, 0.1])
    worse = np.array([0.6, 0.4, 0.3, 0.7, 0.9, 0.1])
    assert judge(labels, good, good, 0.002, 1.01)[0]
    passed, reason, figures = judge(labels, worse, good, 0.002, 1.01)
    assert not passed and "auc" in reason and "logloss" in reason
    assert figures["served_auc"] == 1.0
    one_class = np.ones(6, np.float32)  # AUC undefined: judged on logloss alone
    assert judge(one_class, good, good, 0.002, 1.01)[0]
    # a candidate scoring NaN: its AUC and logloss are NaN, which no comparison fails
    broken = np.array([0.2, np.nan, 0.3, 0.7, np.nan, 0.1])
    passed, reason, _ = judge(labels, broken, good, 0.002, 1.01)
    assert not passed and reason == "2 of 6 candidate scores not finite"


def test_promote_off_and_always(tmp_path: Path) -> None:
    cfg = config()
    learner = DINLearner(cfg)
    for mode, root in (("off", tmp_path / "off"), ("always", tmp_path / "always")):
        store = SnapshotStore(root)
        promoter = Promoter(store, LearnerConfig(promote=mode))
        for k in range(2):
            learner.learn_many(window(200, k, k))
            promoter.on_snapshot(store.write(
                group_state(learner.state_arrays()), micro_batches=k, samples_trained=0, positions=(),
                config={"model": cfg.model_dump(mode="json")},
            ))
        assert store.current() == (None if mode == "off" else 2)


def test_the_gate_checks_the_export_too(tmp_path: Path) -> None:
    cfg = config()
    learner = DINLearner(cfg)
    store = SnapshotStore(tmp_path)
    promoter = Promoter(store, LearnerConfig(promote="always"))

    def snapshot(k: int) -> SnapshotManifest:
        learner.learn_many(window(200, k, k))
        return store.write(
            group_state(learner.state_arrays()), micro_batches=k, samples_trained=0, positions=(),
            config={"model": cfg.model_dump(mode="json")},
        )

    promoter.on_snapshot(snapshot(1))
    assert store.current() == 1
    second = snapshot(2)
    params = export_snapshot(store, 2) / "model.pdiparams"  # its export there already, then damaged
    params.write_bytes(params.read_bytes()[:-10])
    promoter.on_snapshot(second)
    assert store.current() == 1  # not promoted onto an export that fails its checksums
    gated = Promoter(store, LearnerConfig(promote="gate"))
    gated.on_snapshot(snapshot(3))
    assert gated.pending == 3
    damaged = export_dir(tmp_path, 1) / "model.pdiparams"  # the served version's export
    damaged.write_bytes(damaged.read_bytes()[:-10])
    batch = window(200, 9, 9)
    assert gated.on_scored(batch, learner.predict_many(batch)) is None  # held: nothing to judge by
    assert store.current() == 1


def two_versions(root: Path) -> tuple[DINLearner, SnapshotStore, Promoter]:
    """Two versions written and exported at ``root``: the first promoted, the second pending."""
    cfg = config()
    learner = DINLearner(cfg)
    store = SnapshotStore(root)
    promoter = Promoter(store, LearnerConfig(min_eval_samples=50))
    for k in range(2):
        learner.learn_many(window(200, k, k))
        promoter.on_snapshot(store.write(
            group_state(learner.state_arrays()), micro_batches=k + 1, samples_trained=0, positions=(),
            config={"model": cfg.model_dump(mode="json")},
        ))
    return learner, store, promoter


def test_the_gate_judges_no_version_by_a_micro_batch_too_small(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The demo's last micro-batch held 4 samples (AUC nan): a version judged by it is promoted
    or held by noise. One under ``min_eval_samples`` judges nothing; the next snapshot is.
    """
    learner, store, promoter = two_versions(tmp_path)
    assert store.current() == 1 and promoter.pending == 2
    tiny = window(4, 7, 10_000)
    with caplog.at_level(logging.INFO, logger="streamrec.serving.gate"):
        assert promoter.on_scored(tiny, learner.predict_many(tiny)) is None
    assert store.current() == 1 and promoter.pending is None
    assert "too small to judge" in caplog.text and "samples=4" in caplog.text
    enough = window(50, 8, 20_000)
    promoter.pending = 2
    assert promoter.on_scored(enough, learner.predict_many(enough)) is not None


def test_the_version_a_learner_resumes_from_is_judged_by_the_first_micro_batch_after_it(
    tmp_path: Path,
) -> None:
    """A learner stopped after a snapshot (its last, written as it stops) left that version
    pending in memory: restarted from it, it never judged it, and serving kept the version
    before for good. Resumed, the gate takes it up as if it had just been written.
    """
    learner, store, first_run = two_versions(tmp_path)
    assert store.current() == 1 and first_run.pending == 2  # then the learner stopped
    restarted = Promoter(store, LearnerConfig(min_eval_samples=50))
    restarted.resume(store.manifest(2))
    assert restarted.pending == 2
    enough = window(200, 8, 20_000)
    judgement = restarted.on_scored(enough, learner.predict_many(enough))
    assert judgement is not None and judgement.candidate == 2 and judgement.served == 1


def test_resuming_leaves_a_version_once_promoted_and_promotes_one_with_nothing_served(
    tmp_path: Path,
) -> None:
    learner, store, _ = two_versions(tmp_path)
    store.promote(2, reason="test")
    store.rollback()  # an operator took version 2 back: the learner resumes from it
    assert store.current() == 1
    for version in (1, 2):
        restarted = Promoter(store, LearnerConfig(min_eval_samples=50))
        restarted.resume(store.manifest(version))
        assert restarted.pending is None
    restarted.resume(None)  # nothing restored: nothing pending
    assert restarted.pending is None
    fresh = SnapshotStore(tmp_path / "fresh")  # a learner killed before its first promotion
    manifest = fresh.write(
        group_state(learner.state_arrays()), micro_batches=1, samples_trained=0, positions=(),
        config={"model": config().model_dump(mode="json")},
    )
    Promoter(fresh, LearnerConfig(promote="off")).resume(manifest)
    assert fresh.current() is None
    Promoter(fresh, LearnerConfig()).resume(manifest)
    assert fresh.current() == 1  # the first version, its export built on the way
    assert export_dir(fresh.root, 1).is_dir()


def test_ranks_judge_by_the_groups_scores_each_scored_by_the_served_version_on_its_own_rank(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Several ranks: rank 0 asks `due` which served version the next micro-batch judges by,
    every rank scores its own samples by it (`served_scores`), and rank 0 judges the group's
    gathered scores (`on_judged`) as `on_scored` judges one process's micro-batch.
    """
    assert Promoter(SnapshotStore(tmp_path), LearnerConfig()).due() is None  # nothing pending
    learner, store, promoter = two_versions(tmp_path)
    assert promoter.due() == 1 and promoter.pending == 2
    halves = [window(100, 5, 30_000), window(100, 6, 40_000)]
    follower = Promoter(SnapshotStore(tmp_path), LearnerConfig())  # another rank's: no pending
    served = [promoter.served_scores(1, halves[0]), follower.served_scores(1, halves[1])]
    labels = np.concatenate([h.label for h in halves])
    probs = np.concatenate([learner.predict_many(h) for h in halves])
    unscored = np.concatenate([served[0], np.full(100, np.nan)])  # a rank could not load it
    with caplog.at_level(logging.WARNING, logger="streamrec.serving.gate"):
        assert promoter.on_judged(labels, probs, unscored, 1) is None
    assert "not scored by the served version" in caplog.text and promoter.pending is None
    assert store.current() == 1
    promoter.pending = 2
    judged = promoter.on_judged(labels, probs, np.concatenate(served), 1)
    assert promoter.pending is None
    assert judged is not None and (judged.candidate, judged.served) == (2, 1)
    passed, _, figures = judge(labels, probs, np.concatenate(served), 0.002, 1.01)
    assert judged.passed == passed and judged.auc == figures["auc"] and judged.logloss == figures["logloss"]
    own = judge(labels[:100], probs[:100], served[0], 0.002, 1.01)[2]  # rank 0's own: other figures
    assert own["auc"] != judged.auc
    assert store.current() == (2 if passed else 1)


def test_an_unreadable_pointer_stops_no_learner_and_a_promotion_repairs_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A garbage CURRENT made the learner's path raise (prune after a snapshot, the gate's
    on_snapshot, due and resume). It is logged once; the gate judges and promotes nothing
    until an operator promotes a version; under promote=always the next promotion repairs it.
    """
    learner, store, promoter = two_versions(tmp_path)
    (tmp_path / "serving" / "CURRENT").write_text("garbage\n")
    cfg = config()
    with caplog.at_level(logging.WARNING, logger="streamrec.serving.gate"):
        learner.learn_many(window(200, 3, 3))
        manifest = store.write(
            group_state(learner.state_arrays()), micro_batches=3, samples_trained=0, positions=(),
            config={"model": cfg.model_dump(mode="json")},
        )
        assert store.prune(1) == [2]  # the learner's retention after a snapshot: 1 promoted, 3 newest
        promoter.on_snapshot(manifest)
        batch = window(200, 9, 9)
        assert promoter.on_scored(batch, learner.predict_many(batch)) is None
        promoter.resume(manifest)
    assert caplog.text.count("names no version") == 1, caplog.text
    assert (tmp_path / "serving" / "CURRENT").read_text() == "garbage\n"  # the gate held
    Promoter(store, LearnerConfig(promote="always")).on_snapshot(manifest)
    assert store.current() == 3
