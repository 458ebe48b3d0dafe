"""Automatic promotion: every snapshot is exported, and promoted only if it holds up.

A snapshot is taken after a micro-batch is trained, so the next micro-batch is data neither
the candidate nor the served version has seen. The learner scores it with the candidate
before training on it (progressive validation; its first part when a micro-batch is trained in
parts, `streamrec.learner.parts`, as the later parts meet weights trained on the first); the
gate scores the same samples with the served export too, and promotes the candidate when its
AUC is at least the served one's minus a margin and its logloss at most the served one's times
a ratio. A failed gate leaves the pointer where it is and says why. The first version is
promoted as it is: there is nothing to hold it against.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from functools import partial

import numpy as np

from streamrec.config import LearnerConfig
from streamrec.errors import NotExportable, NotServable, SnapshotError, StreamrecError
from streamrec.learner.columns import SampleColumns
from streamrec.learner.metrics import auc, logloss
from streamrec.serving.export import build_missing_export, export_snapshot, prune_exports
from streamrec.serving.loading import load_problem, serve_check
from streamrec.serving.scorer import ExportedModel
from streamrec.snapshots.promotion import promote
from streamrec.snapshots.store import SnapshotManifest, SnapshotStore, version_name

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Judgement:
    """One gate decision on the same micro-batch."""

    candidate: int
    served: int
    auc: float
    served_auc: float
    logloss: float
    served_logloss: float
    passed: bool
    reason: str


def judge(
    labels: np.ndarray, candidate: np.ndarray, served: np.ndarray, auc_margin: float, logloss_ratio: float
) -> tuple[bool, str, dict[str, float]]:
    """Whether ``candidate`` scores hold against ``served`` ones on ``labels``, why, and the figures.

    AUC is skipped (not failed) on a micro-batch of one class, where it is undefined; a
    candidate score that is not finite fails.
    """
    figures = {
        "auc": auc(labels, candidate), "served_auc": auc(labels, served),
        "logloss": logloss(labels, candidate), "served_logloss": logloss(labels, served),
    }
    broken = int((~np.isfinite(candidate)).sum())
    if broken:  # its AUC and logloss are NaN, which no comparison below fails
        return False, f"{broken} of {len(candidate)} candidate scores not finite", figures
    failures = []
    if not (math.isnan(figures["auc"]) or math.isnan(figures["served_auc"])):
        if figures["auc"] < figures["served_auc"] - auc_margin:
            failures.append(
                f"auc {figures['auc']:.4f} < served {figures['served_auc']:.4f} - {auc_margin:g}"
            )
    if figures["logloss"] > figures["served_logloss"] * logloss_ratio:
        failures.append(
            f"logloss {figures['logloss']:.4f} > served {figures['served_logloss']:.4f} x {logloss_ratio:g}"
        )
    return not failures, "; ".join(failures) or "holds against the served version", figures


class Promoter:
    """Exports each snapshot and promotes it per ``cfg.promote`` (see the module docstring)."""

    def __init__(self, store: SnapshotStore, cfg: LearnerConfig) -> None:
        """Promote within ``store`` per ``cfg.promote``, ``gate_auc_margin``, ``gate_logloss_ratio``."""
        self.store = store
        self.cfg = cfg
        self.pending: int | None = None  # a snapshot waiting for the next micro-batch (its first part)
        self._served: ExportedModel | None = None
        self._pointer_error: str | None = None  # the unreadable pointer last logged
        self._said_unserved = False  # that this learner's versions are not exported, or not servable

    def on_snapshot(self, manifest: SnapshotManifest) -> None:
        """Export the new version.

        Promote it now if nothing is served or promotion is unconditional, else keep it for
        `on_scored`. A failed export is logged: the learner trains on, and serving keeps
        the version it has.
        """
        try:
            path = export_snapshot(self.store, manifest.version)
            prune_exports(self.store)  # those of versions retention removed
        except NotExportable as exc:  # the learner's class, the same at every snapshot: said once
            self._once(f"{exc}: no version is exported or promoted, so `streamrec serve` has none to "
                       "serve; the learner trains and snapshots on")
            return
        except (StreamrecError, OSError) as exc:
            logger.error("export failed version=%s error=%s", manifest.name, exc)
            return
        if self.cfg.promote == "off":
            return
        problem = load_problem(path)  # its checksums too: a kept export is checked as a new one
        if problem is not None and problem.own:  # a learner's own export: nothing to judge or serve
            self._not_servable(manifest.learner, problem.message)
            return
        if problem is not None:
            logger.error("export failed version=%s error=%s", manifest.name, problem.message)
            return
        reason = self._unjudged_reason()
        if reason is not None:
            self._promote(manifest.version, reason)
            return
        self.pending = manifest.version

    def _once(self, message: str) -> None:
        """A WARNING the first time, for what holds at every snapshot of this learner."""
        if not self._said_unserved:
            logger.warning("%s (said once, not at each snapshot)", message)
        self._said_unserved = True

    def resume(self, manifest: SnapshotManifest | None) -> None:
        """Take up the version a learner resumed from (``manifest``; None: it started afresh).

        A version written as a learner stopped, or just before it was killed, waits for the
        micro-batch after it, which its run never saw: it is judged by the next run's first
        micro-batch instead, as if it had just been written (its export is built on
        promotion if the run died before it). A version ever promoted (the one served, or
        one an operator rolled back) is left as it is.
        """
        if manifest is None or self.cfg.promote == "off":
            return
        if manifest.version in self.store.promoted():
            return
        reason = self._unjudged_reason()
        if reason is not None:
            self._promote(manifest.version, f"{reason}, resumed")
            return
        logger.info("promotion pending version=%s: the version resumed from", manifest.name)
        self.pending = manifest.version

    def on_scored(self, batch: SampleColumns, probs: np.ndarray) -> Judgement | None:
        """Judge the pending version by the micro-batch after it.

        ``probs`` are the learner's scores before training on ``batch`` (the candidate's, since
        nothing was trained in between). Returns the judgement, or None when nothing was
        pending.
        """
        served = self.due()
        scores = np.full(len(batch), np.nan)
        if served is not None and len(batch) >= self.cfg.min_eval_samples:
            scores = self.served_scores(served, batch)
        return self.on_judged(batch.label, probs, scores, served)

    def due(self) -> int | None:
        """The served version the next micro-batch judges the pending one by; None: no judgement.

        Several learner ranks: rank 0 asks before a micro-batch, every rank scores its own
        samples by that version (`served_scores`), and rank 0 judges the group's (`on_judged`).
        """
        current = self._current()
        if self.pending is None or current is None or self.pending == current:
            return None
        return current

    def _unjudged_reason(self) -> str | None:
        """Why a new version is promoted unjudged (nothing served, promote=always), or None."""
        current = self._current()
        if current is None and self._pointer_error is None:
            return "first version"
        return "promote=always" if self.cfg.promote == "always" else None

    def _current(self) -> int | None:
        """The served version; None when nothing is promoted or the pointer is unreadable.

        An unreadable pointer (a serving-side file) must not stop the learner: it is logged
        once, and the gate judges nothing until a promotion replaces it.
        """
        try:
            current = self.store.current()
        except SnapshotError as exc:
            if str(exc) != self._pointer_error:
                logger.error(
                    "serving pointer unreadable: the gate judges no version until one is promoted "
                    "(`streamrec snapshot promote VERSION`) error=%s", exc,
                )
            self._pointer_error = str(exc)
            return None
        self._pointer_error = None
        return current

    def served_scores(self, version: int, batch: SampleColumns) -> np.ndarray:
        """``batch`` scored by ``version``'s export; NaN each, logged, if it cannot be loaded."""
        try:
            return self._served_model(version).score_batch(batch)
        except SnapshotError as exc:
            logger.error("cannot load the served version=%s to judge by error=%s", version_name(version), exc)
            return np.full(len(batch), np.nan)

    def on_judged(
        self, labels: np.ndarray, probs: np.ndarray, served_probs: np.ndarray, served: int | None
    ) -> Judgement | None:
        """Judge the pending version by a micro-batch's ``labels``, its scores and ``served``'s.

        ``served_probs`` are the scores of version ``served`` (`due`, asked before the
        micro-batch; None: nothing to judge); a NaN among them (a sample it did not score)
        holds the candidate unjudged. Returns the judgement, or None when none was made.
        """
        candidate, self.pending = self.pending, None
        if candidate is None or served is None or candidate == served:
            return None
        if len(labels) < self.cfg.min_eval_samples:
            # Judged by a handful of samples, a version is promoted or held by noise. The
            # learner trains on them, so the candidate is no longer what it scores next:
            # leave it, and judge the next snapshot.
            logger.info(
                "promotion not judged version=%s samples=%d min_eval_samples=%d: the micro-batch "
                "after it is too small to judge it by", version_name(candidate), len(labels),
                self.cfg.min_eval_samples,
            )
            return None
        if np.isnan(served_probs).any():
            logger.warning(
                "promotion held version=%s served=%s: samples=%d of the micro-batch were not scored "
                "by the served version", version_name(candidate), version_name(served),
                int(np.isnan(served_probs).sum()),
            )
            return None
        passed, reason, figures = judge(
            labels, probs, served_probs, self.cfg.gate_auc_margin, self.cfg.gate_logloss_ratio
        )
        judgement = Judgement(candidate, served, passed=passed, reason=reason, **figures)
        if passed:
            self._promote(candidate, f"gate: {reason}")
        else:
            logger.warning(
                "promotion held version=%s served=%s reason=%s auc=%.4f served_auc=%.4f "
                "logloss=%.4f served_logloss=%.4f",
                version_name(candidate), version_name(served), reason, judgement.auc,
                judgement.served_auc, judgement.logloss, judgement.served_logloss,
            )
        return judgement

    def _served_model(self, version: int) -> ExportedModel:
        if self._served is None or self._served.version != version:
            self._served = ExportedModel(export_snapshot(self.store, version))
        return self._served

    def _not_servable(self, learner: str, problem: str) -> None:
        self._once(
            f"{learner}'s exports are its own, not one `streamrec serve` loads ({problem}): the gate "
            "promotes none of its versions; a server of your own scores them by their contract.json, "
            "and `streamrec snapshot promote VERSION --own-server` points serving/CURRENT at one for it"
        )

    def _promote(self, version: int, reason: str) -> None:
        try:
            build, check = partial(build_missing_export, self.store), serve_check(self.store.root)
            promote(self.store, version, reason=reason, build_export=build, serve_check=check)
        except NotServable as exc:  # a version resumed from, exported by a learner of its own
            self._not_servable(self.store.manifest(version).learner, str(exc))
            return
        except SnapshotError as exc:
            logger.error("promotion failed version=%s error=%s", version_name(version), exc)
            return
        logger.info("promoted version=%s reason=%s", version_name(version), reason)
