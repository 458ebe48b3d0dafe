"""Traffic between versions in ``streamrec serve``: each user's arm and the model that answers it.

`Router` sits over a `Scorer` (which follows ``serving/CURRENT``) and follows the traffic plan
beside the pointer (`streamrec.snapshots.traffic`) the same way: polled, the versions a new plan
names loaded and verified off the event loop while requests go on under the old plan, then
swapped in by one reference assignment. A plan whose versions cannot all be loaded is not
taken: the old routing stands, the failure is logged once and counted, and a canary that
cannot load is ended (`streamrec.serving.guard`). Without a plan every user is in the arm
``served``.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from streamrec.errors import SnapshotError
from streamrec.serving.export import export_snapshot
from streamrec.serving.scorer import ExportedModel, Scorer
from streamrec.snapshots.directory import version_name
from streamrec.snapshots.traffic import SERVED, TrafficPlan, read_plan

logger = logging.getLogger(__name__)

# A request's latency buckets, for the whole server and for each arm alike: a request scores 100
# candidates in milliseconds; the upper buckets show the wait of an overloaded server.
REQUEST_SECONDS_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)
OK, ERROR = "ok", "error"
# How many checks the end of a plan waits for the scorer to swap in the version it promoted:
# the scorer follows the pointer every poll, so 10 covers a slow load of a large export.
MAX_HOLD_POLLS = 10
# Versions whose series an arm keeps, newest first seen: a server that follows its learner serves
# a new version each snapshot, and every version's series stayed (27 each) without bound. Three
# keep the one answering and the two before, idle for at least a promotion each by the time they
# go, so a scrape between two promotions still reads their last counts.
KEPT_VERSIONS = 3


class ArmMetrics:
    """Requests, latency and mean score per arm and version (labels ``arm`` and ``version``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        """Register the metrics in ``registry`` (serving's)."""
        labels = ["arm", "version"]
        # Each arm's versions with series, oldest first (both outcomes' made at the first request).
        self._seen: dict[str, OrderedDict[str, None]] = {}
        self.requests = Counter(
            "streamrec_serving_arm_requests",
            "Score requests answered by arm, version and outcome "
            "(error: the model or the feature store failed; a bad request is not counted)",
            [*labels, "outcome"],
            registry=registry,
        )
        self.seconds = Histogram(
            "streamrec_serving_arm_request_seconds",
            "Time to answer a score request by arm and version, from its arrival",
            labels,
            buckets=REQUEST_SECONDS_BUCKETS,
            registry=registry,
        )
        self.score_sum = Counter(
            "streamrec_serving_arm_score_sum",
            "Sum of the scores returned, by arm and version "
            "(divided by streamrec_serving_arm_scores_total: the mean score)",
            labels,
            registry=registry,
        )
        self.scores = Counter(
            "streamrec_serving_arm_scores",
            "Scores returned, by arm and version",
            labels,
            registry=registry,
        )

    def observe(self, arm: str, version: int, seconds: float, scores: list[float] | None) -> None:
        """One request answered (``scores``) or failed (None).

        An arm's first request makes both outcomes' series, so that a rate of its failures
        sees the first one that follows.
        """
        name = version_name(version)
        seen = self._seen.setdefault(arm, OrderedDict())
        if name not in seen:
            seen[name] = None
            for outcome in (OK, ERROR):
                self.requests.labels(arm, name, outcome)
            while len(seen) > KEPT_VERSIONS:
                self._drop(arm, seen.popitem(last=False)[0])
        self.requests.labels(arm, name, OK if scores is not None else ERROR).inc()
        self.seconds.labels(arm, name).observe(seconds)
        if scores:
            self.score_sum.labels(arm, name).inc(sum(scores))
            self.scores.labels(arm, name).inc(len(scores))

    def _drop(self, arm: str, name: str) -> None:
        """Remove the series of ``arm``'s version ``name`` (a later request of it makes them anew)."""
        for outcome in (OK, ERROR):
            self.requests.remove(arm, name, outcome)
        for metric in (self.seconds, self.score_sum, self.scores):
            metric.remove(arm, name)  # nothing to remove is no error


@dataclass(frozen=True)
class LoadedArm:
    """An arm routed to now: its name, the version answering it and that version's engine."""

    arm: str
    version: int
    engine: str  # "onnx" or "paddle" (`streamrec.serving.engines`)


class ArmEngines(Collector):
    """``streamrec_serving_arm_engine_info``: 1 per arm routed to now, read on scrape.

    Read from the router on each scrape, so an arm of an ended plan is gone rather than left at
    its last value.
    """

    def __init__(self, arms: Callable[[], list[LoadedArm]]) -> None:
        """Report the arms ``arms()`` names (`Router.arms`)."""
        self.arms = arms

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """One family: 1 for each arm, version and the engine running it."""
        family = GaugeMetricFamily(
            "streamrec_serving_arm_engine_info",
            "1 for each arm routed to now, its version and the engine running it "
            "(onnx: ONNX Runtime, paddle: Paddle Inference); without a plan the arm served",
            labels=["arm", "version", "engine"],
        )
        for loaded in self.arms():
            family.add_metric([loaded.arm, version_name(loaded.version), loaded.engine], 1)
        yield family


class Router:
    """Each user's arm and model, following the traffic plan of the scorer's snapshot directory.

    ``plan`` is the plan being routed by (None: everyone on the served version) and
    ``load_failures`` counts plans that could not be taken; ``plan_problem`` says why the
    last one was not (None when it was).
    """

    def __init__(self, scorer: Scorer, threads: int = 1) -> None:
        """Route by the plan in force now, if its versions load (else by none, logged)."""
        self.scorer = scorer
        self.root = scorer.store.root
        self._threads = threads
        self._state: tuple[TrafficPlan | None, dict[int, ExportedModel]] = (None, {})
        self._lock = threading.Lock()
        self.load_failures = 0
        self.plan_problem: str | None = None
        self._held = 0  # checks the end of a plan was held for (`_awaiting_promotion`)
        self.refresh()

    @property
    def plan(self) -> TrafficPlan | None:
        """The plan requests are routed by."""
        return self._state[0]

    def route(self, user_id: str) -> tuple[TrafficPlan | None, str, ExportedModel]:
        """The plan, the arm ``user_id`` is in and its model, read together.

        The caller holds the model for the whole request.
        """
        plan, models = self._state
        served = self.scorer.model
        if plan is None:
            return None, SERVED, served
        arm = plan.arm_of(user_id)
        return plan, arm.name, served if arm.version is None else models[arm.version]

    def arms(self) -> list[LoadedArm]:
        """Every arm routed to now, in the plan's order (without a plan: ``served`` alone)."""
        plan, models = self._state
        served = self.scorer.model
        if plan is None:
            return [LoadedArm(SERVED, served.version, served.engine)]
        answering = [(arm.name, served if arm.version is None else models[arm.version]) for arm in plan.arms]
        return [LoadedArm(name, model.version, model.engine) for name, model in answering]

    def refresh(self) -> bool:
        """Take the plan in the file if it changed and its versions load; True when taken."""
        with self._lock:
            try:
                plan = read_plan(self.root)
            except SnapshotError as exc:
                self._failed(str(exc))
                return False
            current, models = self._state
            if plan == current or self._awaiting_promotion(current, plan):
                return False
            loaded: dict[int, ExportedModel] = {}
            try:
                for version in sorted(plan.versions() if plan is not None else ()):
                    loaded[version] = models.get(version) or self._load(version)
            except SnapshotError as exc:
                self._failed(f"cannot load {version_name(version)} of {plan and plan.describe()}: {exc}")
                return False
            self._state = (plan, loaded)  # one reference swap: a request keeps the model it was given
            self.plan_problem = None
            logger.info("routing by traffic plan=%s", plan.describe() if plan else "none (all served)")
            return True

    def _awaiting_promotion(self, running: TrafficPlan | None, plan: TrafficPlan | None) -> bool:
        """Whether to keep routing by ``running`` a little longer, though it has ended.

        It ended by the promotion of one of its versions, which the scorer has not swapped in
        yet, so its users would see the old served version for a poll. At most
        `MAX_HOLD_POLLS` checks, so a scorer that cannot load it holds nothing.
        """
        if plan is not None or running is None or self._held >= MAX_HOLD_POLLS:
            self._held = 0
            return False
        try:
            pointer = self.scorer.store.current()
        except SnapshotError:
            return False
        if pointer is None or pointer not in running.versions() or pointer == self.scorer.model.version:
            self._held = 0
            return False
        self._held += 1
        return True

    def _load(self, version: int) -> ExportedModel:
        served = self.scorer.model
        if served.version == version:
            return served
        path = export_snapshot(self.scorer.store, version)
        return ExportedModel(path, self._threads, engine=self.scorer.engine_choice)

    def _failed(self, problem: str) -> None:
        self.load_failures += 1
        if problem != self.plan_problem:
            logger.error("traffic plan not taken, routing as before (logged once) error=%s", problem)
        self.plan_problem = problem
