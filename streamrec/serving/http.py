"""``streamrec serve``: the promoted model over HTTP, on Starlette (ASGI) and uvicorn.

- ``POST /score`` ``{"user": "u1", "items": ["i1", "i2:c7", {"item": "i3", "category": "c2"}],
  "history": [["i9", "c7"], ...]}`` → ``{"version": 7, "scores": [0.41, ...]}``. Without
  ``history`` the user's sequence is read from the feature store; an unknown user or item
  reads the default rows. A bad request gets 400 with the reason.
- ``GET /healthz`` → ``{"status": "ok", "version": 7, "current": 7, "serves_current": true}``:
  the served version, the one ``serving/CURRENT`` names (null when unreadable) and whether
  they agree (not when the named version fails to load and an older one is kept).
- ``GET /metrics``: Prometheus, in a registry of its own.

Starlette and uvicorn are the well-kept, typed ASGI pair (FastAPI is built on the first): a
small app with no framework to learn, and uvicorn's httptools loop. A task looks at the serving
pointer every ``poll_s``; a new version is loaded and verified on a worker thread while
requests go on with the old one, then swapped in by one reference assignment.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from streamrec.featurestore import FeatureStore
from streamrec.serving.scorer import Candidate, Scorer

logger = logging.getLogger(__name__)

# A request scores 100 candidates in about a millisecond; the upper buckets catch a stall.
REQUEST_SECONDS_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class BadRequest(ValueError):
    """A request the service cannot score; its message is the 400 response's reason."""


class ServingMetrics:
    """The service's metrics in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "streamrec_serving_requests", "Score requests by HTTP status", ["status"],
            registry=self.registry,
        )
        self.seconds = Histogram(
            "streamrec_serving_request_seconds", "Time to answer a score request",
            buckets=REQUEST_SECONDS_BUCKETS, registry=self.registry,
        )
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
        self.reloads = Counter(
            "streamrec_serving_reloads", "Versions swapped in after the pointer moved",
            registry=self.registry,
        )


def parse_request(
    body: bytes, max_candidates: int
) -> tuple[str, list[Candidate], list[tuple[str, str]] | None]:
    """The user, candidates and optional history of a ``POST /score`` body.

    Raises:
        BadRequest: naming what is wrong.
    """
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise BadRequest("expected a JSON object with 'user' and 'items'")
    user, items = doc.get("user"), doc.get("items")
    if not isinstance(user, str) or not user:
        raise BadRequest("'user' must be a non-empty string")
    if not isinstance(items, list) or not items:
        raise BadRequest("'items' must be a non-empty list")
    if len(items) > max_candidates:
        raise BadRequest(f"{len(items)} items; at most {max_candidates} per request")
    candidates = [_candidate(item) for item in items]
    history = doc.get("history")
    if history is None:
        return user, candidates, None
    if not isinstance(history, list) or not all(
        isinstance(h, list) and len(h) == 2 and all(isinstance(x, str) for x in h) for h in history
    ):
        raise BadRequest("'history' must be a list of [item, category] pairs, oldest first")
    return user, candidates, [(h[0], h[1]) for h in history]


def _candidate(item: object) -> Candidate:
    if isinstance(item, str) and item:
        return Candidate.parse(item)
    if isinstance(item, dict) and isinstance(item.get("item"), str) and item["item"]:
        category = item.get("category")
        if category is not None and not isinstance(category, str):
            raise BadRequest(f"category of {item['item']!r} must be a string")
        return Candidate(item["item"], category)
    raise BadRequest(f"an item is a non-empty string or {{'item': ..., 'category': ...}}: {item!r}")


def build_app(
    scorer: Scorer,
    history_of: Callable[[str], Sequence[tuple[str, str]]],
    poll_s: float = 1.0,
    max_candidates: int = 1000,
    metrics: ServingMetrics | None = None,
) -> Starlette:
    """The ASGI app: ``scorer`` scores, ``history_of(user)`` reads a user's sequence."""
    metrics = metrics or ServingMetrics()
    metrics.version.set(scorer.version)

    async def score(request: Request) -> Response:
        start = time.perf_counter()
        try:
            user, candidates, history = parse_request(await request.body(), max_candidates)
            model = scorer.model  # the version this request is answered with, start to end
            scores = model.score(user, history_of(user) if history is None else history, candidates)
        except BadRequest as exc:
            metrics.requests.labels("400").inc()
            return JSONResponse({"error": str(exc)}, status_code=400)
        except Exception as exc:  # the feature store down, say: one line, and a 503
            metrics.requests.labels("503").inc()
            logger.error("score request failed error=%s", exc)
            return JSONResponse({"error": f"cannot score now: {exc}"}, status_code=503)
        metrics.requests.labels("200").inc()
        metrics.candidates.inc(len(candidates))
        metrics.seconds.observe(time.perf_counter() - start)
        body = orjson.dumps({"version": model.version, "scores": scores.tolist()})
        return Response(body, media_type="application/json")

    async def healthz(request: Request) -> Response:
        return JSONResponse({
            "status": "ok", "version": scorer.version, "current": scorer.current,
            "serves_current": scorer.serves_current,
        })

    async def prometheus(request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(_follow_pointer(scorer, poll_s, metrics))
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    routes = [
        Route("/score", score, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


async def _follow_pointer(scorer: Scorer, poll_s: float, metrics: ServingMetrics) -> None:
    """Swap in each newly promoted version, loading it off the event loop."""
    counted = 0  # the scorer's load failures already in the metric
    while True:
        await asyncio.sleep(poll_s)
        try:
            if await asyncio.to_thread(scorer.refresh):
                metrics.reloads.inc()
                metrics.version.set(scorer.version)
            metrics.load_failures.inc(scorer.load_failures - counted)
            counted = scorer.load_failures
        except Exception:  # never let the watcher die: the service keeps the version it has
            logger.exception("serving pointer check failed")


def store_history(store: FeatureStore) -> Callable[[str], list[tuple[str, str]]]:
    """``history_of`` from the feature store: the user's latest behaviours, oldest first."""

    def history_of(user: str) -> list[tuple[str, str]]:
        return [(b.item_id, b.category_id) for b in store.sequence(user)]

    return history_of


def no_history(user: str) -> list[tuple[str, str]]:
    """``history_of`` without a feature store: every user is new."""
    return []

