"""The learner contract as checks every learner runs: DIN, the baselines, and yours.

As river's ``checks``: `yield_checks` yields one named `Check` per promise of
`Learner`, each bound to a factory of fresh learners; call
it, and it raises ``AssertionError`` naming what broke. `check_learner` runs them all.
The test suite parametrizes pytest over every learner and every check, so a new learner is
one more line there. What a learner promises beyond the contract (that it learns from ids,
that a seed fixes it, that it can be exported) is stated in `Promises`, and the checks
of a promise not made are not yielded.

The samples are small and generated from fixed seeds, so each check runs in well under a
second for a tiny model. Timestamps are integer epoch milliseconds, as everywhere.

Examples:
    A user's own learner (here the item-rate baseline) checked against the contract:

    >>> from streamrec.replay.baselines import ItemRateLearner
    >>> for check in yield_checks(ItemRateLearner):
    ...     check()
    >>> [check.name for check in yield_checks(ItemRateLearner)][:3]
    ['scores_before_training', 'predict_changes_nothing', 'scores_are_per_sample']
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import load as safetensors_load
from safetensors.numpy import save as safetensors_save

from streamrec.learner.base import Learner, PartLearner, TrainResult
from streamrec.learner.columns import SampleColumns
from streamrec.learner.metrics import auc
from streamrec.samples import Sample

#: Makes a fresh, untrained learner; called once per learner a check needs.
LearnerFactory = Callable[[], Learner]
#: Exports a learner into an empty directory and returns how the export scores a batch.
Exporter = Callable[[Learner, Path], Callable[[SampleColumns], np.ndarray]]

# Far from any real date, and fixed: the checks must not depend on the clock.
T0 = 1_700_000_000_000
# The export runs another runtime (Paddle Inference) on float32 weights: agreement to 1e-5
# is what tests/unit/serving/test_export.py holds the DIN export to.
EXPORT_TOLERANCE = 1e-5
# A sample scored alone or among others: the same arithmetic, up to the float32 kernels'
# blocking, which may sum in another order for another batch size.
PER_SAMPLE_TOLERANCE = 1e-6
# Passes over the learnable batch: enough for a tiny DIN at its default learning rate (the
# counters need one); more would hide a learner that barely moves.
LEARNING_PASSES = 5
# A learnable batch ranked this well after LEARNING_PASSES: the labels are a function of
# the target's id and of whether it is in the history, so every learner should rank it
# perfectly; a margin for models that rank a few ties.
LEARNT_AUC = 0.95


@dataclass(frozen=True, slots=True)
class Promises:
    """What a learner promises beyond the contract; only the checks of promises made run.

    Attributes:
        deterministic: Two learners from the factory trained on the same batches score
            alike, and one restored from another's state resumes exactly as it would have.
        learns: A few passes over a batch whose labels follow its target ids and histories
            rank that batch's positives first, and bring its scores closer to its labels.
        knows_targets: ``is_known`` is true for the targets learnt from (a learner without
            ids, such as the ``features`` baseline, knows none).
        export: Exports the learner for serving; the export must score as the learner does.
    """

    deterministic: bool = True
    learns: bool = True
    knows_targets: bool = True
    export: Exporter | None = None


@dataclass(frozen=True, slots=True)
class Check:
    """One check of the contract, bound to a learner factory: call it to run it."""

    name: str
    run: Callable[[], None]

    def __call__(self) -> None:
        """Run the check; raises ``AssertionError`` saying what broke."""
        self.run()

    def __str__(self) -> str:
        """The check's name."""
        return self.name


_CheckFn = Callable[[LearnerFactory, Promises], None]


def yield_checks(factory: LearnerFactory, promises: Promises | None = None) -> Iterator[Check]:
    """Every check that applies to the learners ``factory`` makes, given their ``promises``."""
    promises = Promises() if promises is None else promises
    checks: list[_CheckFn] = [
        check_scores_before_training,
        check_predict_changes_nothing,
        check_scores_are_per_sample,
        check_empty_batch,
        check_one_sample_batch,
        check_unknown_ids,
        check_empty_histories_and_missing_categories,
        check_state_is_plain_arrays,
        check_state_round_trip,
        check_is_known,
    ]
    if promises.deterministic:
        checks += [
            check_seeded_runs_agree, check_restored_state_resumes_exactly, check_one_part_is_the_micro_batch
        ]
    if promises.learns:
        checks.append(check_learns_a_learnable_batch)
    if promises.export is not None:
        checks.append(check_export_scores_as_the_learner)
    for fn in checks:
        yield Check(fn.__name__.removeprefix("check_"), _bind(fn, factory, promises))


def check_learner(factory: LearnerFactory, promises: Promises | None = None) -> None:
    """Run every check of `yield_checks`, stopping at the first that fails.

    Raises:
        AssertionError: ``<check>: <what broke>``; a learner that raises in a check (a
            method missing, a crash) fails that check, its exception named and chained.
    """
    for check in yield_checks(factory, promises):
        try:
            check()
        except AssertionError as exc:
            raise AssertionError(f"{check.name}: {exc}") from exc
        except Exception as exc:
            raise AssertionError(f"{check.name}: {type(exc).__name__}: {exc}") from exc


def _bind(fn: _CheckFn, factory: LearnerFactory, promises: Promises) -> Callable[[], None]:
    def run() -> None:
        fn(factory, promises)

    return run


# -- samples -------------------------------------------------------------------------------


def clicks(n: int, seed: int, ts: int = T0, prefix: str = "") -> SampleColumns:
    """Clicks of 12 users over 40 items (category = item mod 5), histories from earlier clicks.

    Items are drawn with a Zipf skew, so some are frequent; an item's positive rate follows
    its id (``0.2 + 0.3 * (item mod 3)``), so there is something to learn. ``prefix`` renames
    every id (items, categories, users), to make ids no learner has seen.
    """
    rng = np.random.default_rng(seed)
    histories: dict[str, list[tuple[str, str]]] = {}
    samples = []
    for k in range(n):
        user, item = f"{prefix}u{rng.integers(12)}", int(rng.zipf(1.5)) % 40
        history = histories.setdefault(user, [])
        samples.append(Sample(
            f"{prefix}s{seed}-{k}", user, ts + k, f"{prefix}i{item}", f"{prefix}c{item % 5}",
            int(rng.random() < 0.2 + 0.3 * (item % 3)),
            tuple(h[0] for h in history[-8:]), tuple(h[1] for h in history[-8:]),
        ))
        history.append((f"{prefix}i{item}", f"{prefix}c{item % 5}"))
    return SampleColumns.from_samples(samples)


def learnable(n: int = 64) -> SampleColumns:
    """A batch whose labels any learner can learn: half positives, half negatives.

    Positives target one of four items that is also in the user's history, in the
    positives' category; negatives one of four others, absent from the history, in another.
    """
    samples = []
    for k in range(n):
        positive = k % 2 == 0
        item, category = (f"p{k % 4}", "cp") if positive else (f"n{k % 4}", "cn")
        history = (f"h{k % 3}", item) if positive else (f"h{k % 3}", f"h{k % 5}")
        samples.append(Sample(
            f"l{k}", f"u{k % 6}", T0 + k, item, category, int(positive), history,
            tuple("cp" if h == item else "ch" for h in history),
        ))
    return SampleColumns.from_samples(samples)


def odd(ts: int = T0 + 10**6) -> SampleColumns:
    """Samples at the edges: no history, no category, a history longer than any model keeps."""
    long = tuple(f"i{k % 40}" for k in range(300))
    return SampleColumns.from_samples([
        Sample("o0", "u1", ts, "i1", "c1", 1, (), ()),
        Sample("o1", "u2", ts, "i2", "", 0, ("i1",), ("",)),
        Sample("o2", "u3", ts, "", "", 0, ("", ""), ("", "")),
        Sample("o3", "u4", ts, "i3", "c3", 1, long, tuple(f"c{k % 40 % 5}" for k in range(300))),
        Sample("o4", "", ts, "i4", "c4", 0, ("i4",), ("c4",)),
    ])


def _empty() -> SampleColumns:
    return SampleColumns.from_samples([])


def _trained(factory: LearnerFactory, batches: int = 2) -> Learner:
    learner = factory()
    for k in range(batches):
        learner.learn_many(clicks(200, k, T0 + k * 10_000))
    return learner


# -- assertions ----------------------------------------------------------------------------


def _assert_scores(scores: object, size: int, what: str) -> np.ndarray:
    assert isinstance(scores, np.ndarray), f"{what}: scores are {type(scores).__name__}, not an ndarray"
    assert scores.shape == (size,), f"{what}: scores have shape {scores.shape}, expected ({size},)"
    assert scores.dtype == np.float64, f"{what}: scores are {scores.dtype}, not float64"
    assert np.isfinite(scores).all(), f"{what}: {int((~np.isfinite(scores)).sum())} scores not finite"
    assert ((scores >= 0) & (scores <= 1)).all(), (
        f"{what}: scores outside [0, 1]: {scores[(scores < 0) | (scores > 1)][:5]}"
    )
    return scores


def _assert_known(known: object, size: int, what: str) -> np.ndarray:
    assert isinstance(known, np.ndarray), f"{what}: is_known gave {type(known).__name__}, not an ndarray"
    assert known.shape == (size,) and known.dtype == np.bool_, (
        f"{what}: is_known gave {known.dtype} {known.shape}, expected bool ({size},)"
    )
    return known


def _assert_same_state(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray], what: str) -> None:
    assert set(a) == set(b), f"{what}: state keys differ: {sorted(set(a) ^ set(b))[:5]}"
    changed = [k for k in a if not _same(a[k], b[k])]
    assert not changed, f"{what}: state arrays differ: {changed[:5]}"


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Same shape, dtype and values (NaN equal to NaN, where there can be one)."""
    nan = a.dtype.kind in "fc"
    return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b, equal_nan=nan))


def _assert_result(result: object, what: str) -> None:
    assert isinstance(result, TrainResult), f"{what}: learn_many returned {type(result).__name__}"


def _assert_close(got: np.ndarray, want: np.ndarray, tolerance: float, what: str) -> None:
    gap = float(np.abs(got - want).max()) if len(want) else 0.0
    assert gap <= tolerance, f"{what}: scores differ by up to {gap:.3g} (tolerance {tolerance:g})"


# -- the checks ----------------------------------------------------------------------------


def check_scores_before_training(factory: LearnerFactory, promises: Promises) -> None:
    """An untrained learner scores: float64 [B], finite, within [0, 1]."""
    learner = factory()
    batch = clicks(50, 7)
    _assert_scores(learner.predict_many(batch), len(batch), "untrained")
    _assert_scores(learner.predict_many(odd()), len(odd()), "untrained, edge samples")


def check_predict_changes_nothing(factory: LearnerFactory, promises: Promises) -> None:
    """Scoring and ``is_known`` change no state: the same scores twice, the same arrays."""
    learner = _trained(factory, 1)
    batch = clicks(80, 8, T0 + 50_000)
    before = learner.state_arrays()
    first = learner.predict_many(batch)
    learner.is_known(batch)
    second = learner.predict_many(batch)
    assert np.array_equal(first, second), "scoring the same batch twice gave different scores"
    _assert_same_state(before, learner.state_arrays(), "after predict_many and is_known")


def check_scores_are_per_sample(factory: LearnerFactory, promises: Promises) -> None:
    """A sample scores the same alone as among others: nothing leaks across a batch."""
    learner = _trained(factory, 1)
    samples = [*_samples(clicks(12, 9, T0 + 50_000)), *_samples(odd())]
    together = learner.predict_many(SampleColumns.from_samples(samples))
    alone = np.array([learner.predict_many(SampleColumns.from_samples([s]))[0] for s in samples])
    _assert_close(alone, together, PER_SAMPLE_TOLERANCE, "alone against together")


def check_empty_batch(factory: LearnerFactory, promises: Promises) -> None:
    """An empty batch scores as [0], knows [0], and learning from it changes nothing."""
    for learner in (factory(), _trained(factory, 1)):
        _assert_scores(learner.predict_many(_empty()), 0, "empty batch")
        _assert_known(learner.is_known(_empty()), 0, "empty batch")
        before = learner.state_arrays()
        _assert_result(learner.learn_many(_empty()), "empty batch")
        _assert_same_state(before, learner.state_arrays(), "after learning an empty batch")


def check_one_sample_batch(factory: LearnerFactory, promises: Promises) -> None:
    """A batch of one sample trains and scores, from scratch and after training."""
    for learner in (factory(), _trained(factory, 1)):
        for sample in _samples(odd())[:2]:
            one = SampleColumns.from_samples([sample])
            _assert_scores(learner.predict_many(one), 1, "one sample")
            _assert_result(learner.learn_many(one), "one sample")
            _assert_scores(learner.predict_many(one), 1, "one sample, after learning it")
            _assert_known(learner.is_known(one), 1, "one sample")


def check_unknown_ids(factory: LearnerFactory, promises: Promises) -> None:
    """Ids never seen (items, categories, users, along the history too) score finitely."""
    learner = _trained(factory)
    unseen = clicks(60, 11, T0 + 90_000, prefix="never-seen-")
    _assert_scores(learner.predict_many(unseen), len(unseen), "never-seen ids")
    known = _assert_known(learner.is_known(unseen), len(unseen), "never-seen ids")
    assert not known.any(), f"{int(known.sum())} never-seen targets reported known"


def check_empty_histories_and_missing_categories(factory: LearnerFactory, promises: Promises) -> None:
    """No history, an empty category or item id, an over-long history: all score finitely."""
    learner = _trained(factory)
    _assert_scores(learner.predict_many(odd()), len(odd()), "edge samples")
    _assert_result(learner.learn_many(odd()), "edge samples")
    _assert_scores(learner.predict_many(odd()), len(odd()), "edge samples, after learning them")


def check_state_is_plain_arrays(factory: LearnerFactory, promises: Promises) -> None:
    """State keys are ``<group>/<name>`` and every value a numeric numpy array a snapshot stores.

    Snapshots are safetensors files: numbers and booleans only, no objects, no strings,
    nothing that needs pickle to load.
    """
    for learner in (factory(), _trained(factory, 1)):
        arrays = learner.state_arrays()
        assert arrays, "the state is empty"
        for key, array in arrays.items():
            group, _, name = key.partition("/")
            assert group and name, f"state key {key!r} is not <group>/<name>"
            assert isinstance(array, np.ndarray), f"state {key} is {type(array).__name__}, not an ndarray"
            assert array.dtype.kind in "biuf", (
                f"state {key} is {array.dtype}: a snapshot (safetensors) holds numbers and booleans only"
            )
        safetensors_save(dict(arrays))


def check_state_round_trip(factory: LearnerFactory, promises: Promises) -> None:
    """A fresh learner loading another's state (through a snapshot's bytes) scores alike."""
    learner = _trained(factory)
    restored = factory()
    restored.load_state_arrays(_through_a_file(learner.state_arrays()))
    for batch in (clicks(100, 12, T0 + 90_000), odd()):
        _assert_close(restored.predict_many(batch), learner.predict_many(batch), 0.0, "restored")
        assert np.array_equal(restored.is_known(batch), learner.is_known(batch)), "restored: is_known differs"
    _assert_same_state(learner.state_arrays(), restored.state_arrays(), "restored")


def check_is_known(factory: LearnerFactory, promises: Promises) -> None:
    """Nothing is known before training; after it, the targets learnt from are (if promised)."""
    learner = factory()
    batch = clicks(100, 13)
    assert not _assert_known(learner.is_known(batch), len(batch), "untrained").any(), (
        "an untrained learner knows a target"
    )
    learner.learn_many(batch)
    known = _assert_known(learner.is_known(batch), len(batch), "trained")
    if promises.knows_targets:
        assert known.all(), f"{int((~known).sum())} targets just learnt from are not known"


def check_seeded_runs_agree(factory: LearnerFactory, promises: Promises) -> None:
    """Two learners from the factory, trained on the same batches, score and store alike."""
    first, second = _trained(factory), _trained(factory)
    batch = clicks(100, 14, T0 + 90_000)
    _assert_close(first.predict_many(batch), second.predict_many(batch), 0.0, "two seeded runs")
    _assert_same_state(first.state_arrays(), second.state_arrays(), "two seeded runs")


def check_restored_state_resumes_exactly(factory: LearnerFactory, promises: Promises) -> None:
    """A learner restored from a state trains on as the original does: same scores after."""
    learner = _trained(factory)
    restored = factory()
    restored.load_state_arrays(_through_a_file(learner.state_arrays()))
    more = clicks(200, 15, T0 + 90_000)
    learner.learn_many(more)
    restored.learn_many(more)
    batch = clicks(100, 16, T0 + 200_000)
    _assert_close(restored.predict_many(batch), learner.predict_many(batch), 0.0, "resumed")
    _assert_same_state(learner.state_arrays(), restored.state_arrays(), "resumed")


def check_one_part_is_the_micro_batch(factory: LearnerFactory, promises: Promises) -> None:
    """A `PartLearner`'s one part and its close train as ``learn_many``; two parts train each sample.

    The loop trains a micro-batch in parts while it is gathered; a learner without
    ``learn_part`` is trained part by part with ``learn_many``, so nothing to check there.
    """
    whole, parts = _trained(factory), _trained(factory)
    if not isinstance(parts, PartLearner):
        return
    batch = clicks(200, 17, T0 + 90_000)
    whole.learn_many(batch)
    parts.learn_part(batch)
    parts.end_micro_batch()
    _assert_same_state(whole.state_arrays(), parts.state_arrays(), "one part")
    probe = clicks(100, 18, T0 + 200_000)
    before = parts.predict_many(probe)
    for half in (clicks(100, 19, T0 + 100_000), clicks(100, 20, T0 + 110_000)):
        assert parts.learn_part(half).steps > 0, "a part trained no step"
    parts.end_micro_batch()
    assert not _same(parts.predict_many(probe), before), "two parts changed no score"


def check_learns_a_learnable_batch(factory: LearnerFactory, promises: Promises) -> None:
    """A few passes over a trivially learnable batch rank it right and move scores to labels."""
    learner = factory()
    batch = learnable()
    before = learner.predict_many(batch)
    for _ in range(LEARNING_PASSES):
        learner.learn_many(batch)
    after = _assert_scores(learner.predict_many(batch), len(batch), "learnt")
    ranked = auc(batch.label, after)
    assert ranked >= LEARNT_AUC, f"AUC {ranked:.3f} on the batch learnt, expected >= {LEARNT_AUC}"
    gap_before, gap_after = (float(np.abs(s - batch.label).mean()) for s in (before, after))
    assert gap_after < gap_before, (
        f"scores moved away from the labels: mean |score - label| {gap_before:.4f} -> {gap_after:.4f}"
    )


def check_export_scores_as_the_learner(factory: LearnerFactory, promises: Promises) -> None:
    """The export scores as the learner does, unknown ids and empty histories included."""
    assert promises.export is not None
    learner = _trained(factory)
    with tempfile.TemporaryDirectory(prefix="streamrec-check-") as tmp:
        score = promises.export(learner, Path(tmp))
        for batch in (clicks(100, 17, T0 + 90_000), clicks(30, 18, T0 + 90_000, "never-seen-"), odd()):
            _assert_close(score(batch), learner.predict_many(batch), EXPORT_TOLERANCE, "export")


def _samples(batch: SampleColumns) -> list[Sample]:
    """The samples of a batch, back from its columns."""
    ends = np.cumsum(batch.seq_lengths)
    starts = ends - batch.seq_lengths
    items, categories = batch.target_ids("item"), batch.target_ids("category")
    seq_items, seq_categories = batch.sequence_ids("item"), batch.sequence_ids("category")
    return [
        Sample(
            batch.sample_ids[k], str(batch.user_ids[k]), int(batch.ts[k]), items[k], categories[k],
            int(batch.label[k]), tuple(seq_items[starts[k] : ends[k]]),
            tuple(seq_categories[starts[k] : ends[k]]),
        )
        for k in range(len(batch))
    ]


def _through_a_file(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays after a trip through safetensors bytes, as a snapshot stores them."""
    return safetensors_load(safetensors_save(dict(arrays)))

