"""``streamrec serve``: the promoted model over HTTP, on Starlette (ASGI) and uvicorn.

- ``POST /score`` ``{"user": "u1", "items": ["i1", "i2:c7", {"item_id": "i3", "category_id":
  "c2", "genres": ["Drama"]}], "history": [["i9", "c7"], {"item_id": "i4", "category_id": "c2",
  "genres": ["Comedy"]}, ...], "context": {"device": "ios"}}``
  → ``{"version": 7, "arm": "served", "request_id": "...", "scores": [0.41, ...]}`` (the arm
  of a canary or A/B test, `streamrec.serving.routing`; the request id from ``X-Request-Id``
  or the body's ``request_id``, else a new one). ``context`` gives the model's declared context
  features (``STREAMREC_FEATURES``, role ``context``) by name, an item object its own
  behaviour features by name (``item``/``category`` are accepted for ``item_id``/
  ``category_id``), and so does a ``history`` entry (outcomes included: it happened); one
  missing reads its default. Without ``history`` the user's sequence, with its behaviour
  features, and the user's features are read from the stores (`streamrec.serving.features`);
  with it, the user's features read their defaults. An unknown user or item reads the default rows. Ids are
  strings or integers, as in the event contract (``5`` is ``"5"``). A bad request gets 400
  with the reason (a feature value breaking its declaration names the feature), a body over
  ``max_body_bytes`` 413 before the rest is read, and a request the server has no room for
  503 with ``Retry-After`` (`streamrec.serving.admission`).
- ``GET /readyz`` → 200 ``{"status": "ok", "version": 7, "current": 7, "serves_current": true,
  "engine": "onnx", "arms": {"served": {"version": 7, "engine": "onnx"}}}``
  when the server can score, else 503 ``{"status": "unavailable", ..., "reasons": [...]}``
  (`streamrec.serving.readiness`): the served version, the one ``serving/CURRENT`` names
  (null when unreadable) and whether they agree (not when the named version fails to load and
  an older one is kept), and each arm routed to now with its version and engine (a canary's or
  A/B test's arms; without a plan ``served``). ``GET /healthz`` answers the same. ``GET /livez``
  → 200 while the event loop runs.
- ``GET /metrics``: Prometheus, in a registry of its own.

Starlette and uvicorn are the well-kept, typed ASGI pair (FastAPI is built on the first): a
small app with no framework to learn, and uvicorn's httptools loop. Requests are scored on
worker threads, so the loop stays free to read, shed and answer probes. A task looks at the
serving pointer every ``poll_s``; a new version is loaded and verified on a worker thread while
requests go on with the old one, then swapped in by one reference assignment.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from streamrec.config import ServingConfig
from streamrec.errors import InvalidEvent
from streamrec.observability.freshness import ServedFreshness
from streamrec.serving.admission import SHED_CAUSES, Admission, Overloaded
from streamrec.serving.failures import FailureLog
from streamrec.serving.features import no_history as no_history  # its old home
from streamrec.serving.features import store_history as store_history  # its old home
from streamrec.serving.guard import CanaryGuard, follow_traffic
from streamrec.serving.readiness import PROBE_USER, Readiness
from streamrec.serving.requests import BadRequest as BadRequest  # its old home
from streamrec.serving.requests import parse_request as parse_request  # its old home
from streamrec.serving.requests import parse_score_request, request_id_of
from streamrec.serving.routing import REQUEST_SECONDS_BUCKETS, ArmEngines, ArmMetrics, Router
from streamrec.serving.scorer import ExportedModel, Scorer
from streamrec.snapshots.traffic import TrafficPlan

if TYPE_CHECKING:  # the Redis and Kafka clients: imported only when the click join is on
    from streamrec.serving.clicks import ClickJoin

logger = logging.getLogger(__name__)

SCORE_PATH = "/score"
ACCEPTED = "streamrec.accepted"  # scope key: perf_counter() when the request reached the app
RETRY_AFTER_S = "1"  # a shed client may try again in a second: the queue drains within that


class BodyTooLarge(ValueError):
    """A request body over the limit; its message is the 413 response's reason."""


class ServingMetrics:
    """The service's metrics in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "streamrec_serving_requests", "Score requests by HTTP status", ["status"],
            registry=self.registry,
        )
        self.seconds = Histogram(
            "streamrec_serving_request_seconds",
            "Time to answer a score request, from its arrival (its wait for a worker included)",
            buckets=REQUEST_SECONDS_BUCKETS, registry=self.registry,
        )
        self.queue_wait = Histogram(
            "streamrec_serving_queue_wait_seconds",
            "Time a score request waited from its arrival until a worker took it",
            buckets=REQUEST_SECONDS_BUCKETS, registry=self.registry,
        )
        self.in_flight = Gauge(
            "streamrec_serving_in_flight", "Score requests admitted: waiting or scoring",
            registry=self.registry,
        )
        self.shed = Counter(
            "streamrec_serving_shed", "Score requests refused with 503 for want of room, by cause",
            ["cause"], registry=self.registry,
        )
        for cause in SHED_CAUSES:  # at 0 from the start, so a rate sees the first shed
            self.shed.labels(cause)
        self.candidates = Counter(
            "streamrec_serving_candidates", "Candidates scored", registry=self.registry
        )
        self.version = Gauge(
            "streamrec_serving_version", "The version being served", registry=self.registry
        )
        self.load_failures = Counter(
            "streamrec_serving_load_failures", "Failed loads of the promoted version (each retry)",
            registry=self.registry,
        )
        self.engine = Gauge(
            "streamrec_serving_engine_info",
            "1 on the engine running the served version (onnx: ONNX Runtime, paddle: Paddle Inference)",
            ["engine"], registry=self.registry,
        )
        self.reloads = Counter(
            "streamrec_serving_reloads", "Versions swapped in after the pointer moved",
            registry=self.registry,
        )
        self.arms = ArmMetrics(self.registry)  # per arm and version of a canary or an A/B test
        self.freshness = ServedFreshness(self.registry)

    def show(self, scorer: Scorer) -> None:
        """Set the served version's gauges: its number and its engine."""
        self.version.set(scorer.version)
        for name in ("onnx", "paddle"):
            self.engine.labels(name).set(1 if name == scorer.model.engine else 0)




async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, refused as soon as it is known to pass ``limit`` bytes.

    From its ``Content-Length`` before any is read, or once a chunked body's bytes pass it.

    Raises:
        BodyTooLarge: naming the limit.
        BadRequest: the body ended unfinished: the client closed the connection before its
            ``Content-Length`` was read, or sent a malformed chunk (uvicorn has answered 400).
    """
    too_large = BodyTooLarge(f"request body over {limit} bytes (STREAMREC_SERVING__MAX_BODY_BYTES)")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large
            chunks.append(chunk)
    except ClientDisconnect as exc:  # the client's doing, not a failure to score
        logger.debug("request body unfinished after %s bytes: the client disconnected", size)
        raise BadRequest(
            f"request body unfinished after {size} bytes: the connection closed or a chunk was malformed"
        ) from exc
    return b"".join(chunks)


class ScoreEndpoint:
    """``POST /score`` as a plain ASGI app: the endpoint's `Response` to the request, sent."""

    def __init__(self, endpoint: Callable[[Request], Awaitable[Response]]) -> None:
        """Answer with ``endpoint``, which answers every error itself (400, 413, 503)."""
        self.endpoint = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer one request."""
        response = await self.endpoint(Request(scope, receive))
        await response(scope, receive, send)


class RequestTimer:
    """The outermost layer for ``POST /score``.

    Stamps each request's arrival (for the queue wait) and observes its whole time and status,
    whatever answered it. Given the ``score`` endpoint, it runs it directly: the layers below
    (Starlette's exception middleware, the router and its request wrappers) have nothing to do
    for a request whose endpoint answers every error itself, and took a sixth of a request's
    CPU outside the model and the sockets. Other methods on the path still go down to the router
    (405).
    """

    def __init__(self, app: ASGIApp, metrics: ServingMetrics, score: ASGIApp | None = None) -> None:
        """Wrap ``app``; run ``score`` for ``POST /score`` when given."""
        self.app = app
        self.metrics = metrics
        self.score = score

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on, timing it when it is a score request."""
        if scope["type"] != "http" or scope["path"] != SCORE_PATH:
            await self.app(scope, receive, send)
            return
        app = self.score if self.score is not None and scope["method"] == "POST" else self.app
        start = scope[ACCEPTED] = time.perf_counter()
        status = 500

        async def sent(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await app(scope, receive, sent)
        finally:
            self.metrics.requests.labels(str(status)).inc()
            self.metrics.seconds.observe(time.perf_counter() - start)


def _error(status: int, reason: str, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse({"error": reason}, status_code=status, headers=headers)


def build_app(
    scorer: Scorer,
    history_of: Callable[[str], Sequence[tuple[str, str]]],
    cfg: ServingConfig | None = None,
    metrics: ServingMetrics | None = None,
    clicks: ClickJoin | None = None,
    on_shutdown: Sequence[Callable[[], None]] = (),
) -> Starlette:
    """The ASGI app.

    ``scorer`` scores, ``history_of(user)`` reads a user's sequence (and, for a user no event
    can name, tells readiness whether the feature store answers).
    """
    cfg = cfg or ServingConfig()
    metrics = metrics or ServingMetrics()
    router = Router(scorer, cfg.threads)  # each user's arm: one version, or a canary's or A/B test's
    arms = metrics.arms
    guard = CanaryGuard(router, cfg, clicks)
    metrics.registry.register(ArmEngines(router.arms))
    if clicks is not None:  # each served list recorded for the click-through of its arm
        from streamrec.serving.clicks import ClickCollector

        metrics.registry.register(ClickCollector(clicks, lambda: router.plan))
    metrics.show(scorer)
    if scorer.loaded is not None:
        metrics.freshness.take_up(scorer.loaded)
    admission = Admission(cfg.workers, cfg.max_in_flight, cfg.max_queue_wait_s)
    metrics.in_flight.set_function(lambda: admission.in_flight)
    readiness = Readiness(scorer, lambda: history_of(PROBE_USER), cfg.ready_cache_s, cfg.ready_timeout_s)
    failures = FailureLog(logger)

    async def score(request: Request) -> Response:
        routed: tuple[TrafficPlan | None, str, ExportedModel] | None = None
        try:
            with admission.admitted():
                body = await read_body(request, cfg.max_body_bytes)
                user, candidates, history, context = parse_score_request(body, cfg.max_candidates)
                request_id = request_id_of(request.headers, body)
                # the version this request is answered with, start to end
                routed = plan, arm, model = router.route(user)

                def work() -> list[float]:
                    behaviours = history_of(user) if history is None else history
                    try:
                        scored: list[float] = model.score(user, behaviours, candidates, context).tolist()
                    except InvalidEvent as exc:  # a request's feature value breaking its declaration
                        raise BadRequest(str(exc)) from exc
                    if clicks is not None and plan is not None:
                        record_served(clicks, plan, request_id, arm, model.version)
                    return scored

                scores, waited = await admission.run(work, request.scope[ACCEPTED])
        except Overloaded as exc:
            metrics.shed.labels(exc.cause).inc()
            return _error(503, f"overloaded: {exc}", {"Retry-After": RETRY_AFTER_S})
        except BadRequest as exc:
            return _error(400, str(exc))
        except BodyTooLarge as exc:  # and stop reading: the rest of the body is not wanted
            return _error(413, str(exc), {"Connection": "close"})
        except Exception as exc:  # the feature store down, say: a line now and then, and a 503
            failures.failed(exc)
            if routed is not None:
                observe_arm(request, routed, None)
            return _error(503, f"cannot score now: {exc}", {"Retry-After": RETRY_AFTER_S})
        metrics.queue_wait.observe(waited)
        metrics.candidates.inc(len(candidates))
        observe_arm(request, routed, scores)
        body = orjson.dumps(
            {"version": model.version, "arm": arm, "request_id": request_id, "scores": scores}
        )
        return Response(body, media_type="application/json")

    def observe_arm(
        request: Request, routed: tuple[TrafficPlan | None, str, ExportedModel], scores: list[float] | None
    ) -> None:
        plan, arm, model = routed
        seconds = time.perf_counter() - request.scope[ACCEPTED]
        arms.observe(arm, model.version, seconds, scores)
        guard.observe(plan, arm, scores is not None, seconds)

    async def ready(request: Request) -> Response:
        reasons = await readiness.reasons()
        doc: dict[str, object] = {
            "status": "unavailable" if reasons else "ok", "version": scorer.version,
            "current": scorer.current, "serves_current": scorer.serves_current,
            "engine": scorer.model.engine,
            "arms": {a.arm: {"version": a.version, "engine": a.engine} for a in router.arms()},
        }
        if reasons:
            doc["reasons"] = reasons
        return JSONResponse(doc, status_code=503 if reasons else 200)

    async def live(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def prometheus(request: Request) -> Response:
        # off the event loop: the click figures read (and settle lists in) Redis at each scrape
        body = await asyncio.to_thread(generate_latest, metrics.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(_follow_pointer(scorer, cfg.poll_s, metrics))
        traffic = asyncio.create_task(follow_traffic(router, guard, cfg.poll_s))
        try:
            yield
        finally:
            for running in (task, traffic):
                running.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await running
            admission.close()
            for close in on_shutdown:  # the click join's consumer leaves its group
                await asyncio.to_thread(close)

    endpoint = ScoreEndpoint(score)
    routes = [
        Route(SCORE_PATH, endpoint, methods=["POST"]),
        Route("/readyz", ready, methods=["GET"]),
        Route("/healthz", ready, methods=["GET"]),
        Route("/livez", live, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
    ]
    middleware = [Middleware(RequestTimer, metrics=metrics, score=endpoint)]
    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan)


async def _follow_pointer(scorer: Scorer, poll_s: float, metrics: ServingMetrics) -> None:
    """Swap in each newly promoted version, loading it off the event loop."""
    counted = 0  # the scorer's load failures already in the metric
    failures = FailureLog(logger, "serving pointer check failed", "the version served is kept")
    while True:
        await asyncio.sleep(poll_s)
        try:
            if await asyncio.to_thread(scorer.refresh):
                metrics.reloads.inc()
                metrics.show(scorer)
                if scorer.loaded is not None:
                    metrics.freshness.observe_load(scorer.loaded)
            metrics.load_failures.inc(scorer.load_failures - counted)
            counted = scorer.load_failures
        except Exception as exc:  # never let the watcher die: the service keeps the version it has
            failures.failed(exc)


def record_served(clicks: ClickJoin, plan: TrafficPlan, request_id: str, arm: str, version: int) -> None:
    """Record a served list for the click join; a Redis failure is logged, the answer still sent."""
    try:
        clicks.served(plan, request_id, arm, version)
    except Exception as exc:  # the list goes uncounted in click-through: said, never silently
        logger.warning("cannot record a served list for click-through request_id=%s error=%s",
                       request_id, exc)

