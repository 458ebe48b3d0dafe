"""The serving section: ``streamrec serve`` and ``streamrec score``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from streamrec.config.section import MAX_SECONDS, SECTION


class ServingConfig(BaseModel):
    """``streamrec serve`` and ``streamrec score`` (env ``STREAMREC_SERVING__*``).

    They read the promoted version of ``STREAMREC_LEARNER__SNAPSHOT_DIR``.
    """

    model_config = SECTION

    host: str = Field("127.0.0.1", description="STREAMREC_SERVING__HOST")
    port: int = Field(8000, ge=0, le=65535, description="STREAMREC_SERVING__PORT")
    # Server processes sharing the port (uvicorn's workers: the kernel spreads connections over
    # them). Each loads the promoted version and follows the pointer itself, with its own
    # admission limits below; a predictor scores one request at a time, so one process per core.
    processes: int = Field(1, ge=1, description="STREAMREC_SERVING__PROCESSES")
    # How often the server looks at the serving pointer; a new version loads beside the old.
    poll_s: float = Field(1.0, gt=0, le=MAX_SECONDS, description="STREAMREC_SERVING__POLL_S")
    # What runs the model (streamrec.serving.engines): onnx (ONNX Runtime, about twice Paddle's
    # speed here) when the export holds model.onnx and onnxruntime imports, else paddle (Paddle
    # Inference); onnx asks for ONNX Runtime and falls back to paddle with a warning when it
    # cannot be used; paddle always runs Paddle.
    engine: Literal["auto", "onnx", "paddle"] = Field("auto", description="STREAMREC_SERVING__ENGINE")
    # Threads of one engine run: 1 keeps a request's latency steady beside others.
    threads: int = Field(1, ge=1, description="STREAMREC_SERVING__THREADS")
    # Requests waiting for a process's predictor run as one call of up to this many candidates
    # (their inputs stacked): one call of 400 costs less than four of 100; nothing waits on
    # purpose, so a lone request runs at once (streamrec.serving.batching). 0: each alone.
    batch_candidates: int = Field(400, ge=0, description="STREAMREC_SERVING__BATCH_CANDIDATES")
    max_candidates: int = Field(1000, ge=1, description="STREAMREC_SERVING__MAX_CANDIDATES per request")
    # Threads that score requests beside the event loop: one scores while another reads a
    # user's sequence from the feature store (a predictor runs one request at a time).
    workers: int = Field(2, ge=1, description="STREAMREC_SERVING__WORKERS")
    # Score requests admitted at once, waiting or scoring; one more gets 503 with Retry-After
    # at once. 64 is about a quarter second of work at 4 ms a request.
    max_in_flight: int = Field(64, ge=1, description="STREAMREC_SERVING__MAX_IN_FLIGHT")
    # The longest an admitted request waits for a worker before it gets 503 with Retry-After:
    # past it, an answer is worth less than the client's retry elsewhere.
    max_queue_wait_s: float = Field(
        0.5, gt=0, le=MAX_SECONDS, description="STREAMREC_SERVING__MAX_QUEUE_WAIT_S"
    )
    # A request body past this gets 413 before more is read: 1,000 candidates and a history of
    # 50 take about 40 KB, so 1 MiB leaves room and keeps a huge body out of memory.
    max_body_bytes: int = Field(1 << 20, ge=1, description="STREAMREC_SERVING__MAX_BODY_BYTES")
    # A request whose request line and headers pass this gets 431 (414: its request line alone)
    # and is closed as soon as they do, before more is read: uvicorn's httptools parser bounds
    # neither (streamrec.serving.heads). 16 KiB, as h11 and Node.js: a request here carries a
    # few short headers, and a gateway's token or trace headers take a few KiB at most.
    max_header_bytes: int = Field(
        16 << 10, ge=1024, le=1 << 30, description="STREAMREC_SERVING__MAX_HEADER_BYTES"
    )
    # The longest a connection may take to send a request's line and headers, from its opening
    # or the request's first byte: past it, 408 (or closed, when nothing came). uvicorn has no
    # such bound, so a client could hold connections without end (slowloris). 10 s: a head comes
    # in one round trip; nginx and Node.js wait 60 s for browsers on slow links, not a scoring client.
    header_timeout_s: float = Field(
        10.0, gt=0, le=MAX_SECONDS, description="STREAMREC_SERVING__HEADER_TIMEOUT_S"
    )
    # How long one feature-store check answers /readyz: a probe storm costs one Redis round
    # trip a second at most.
    ready_cache_s: float = Field(1.0, gt=0, le=MAX_SECONDS, description="STREAMREC_SERVING__READY_CACHE_S")
    # How long /readyz waits for that check; a store slower than this is reported not ready.
    ready_timeout_s: float = Field(
        1.0, gt=0, le=MAX_SECONDS, description="STREAMREC_SERVING__READY_TIMEOUT_S"
    )

    # A canary (`streamrec snapshot canary`) that falls behind the served version is ended by
    # serve (one instance decides, under the pointer's lock); the history says why.
    canary_auto_rollback: bool = Field(True, description="STREAMREC_SERVING__CANARY_AUTO_ROLLBACK")
    # Requests each arm must have answered on one instance before it is judged: 200 puts one
    # error in 200 (0.5%) within the default margin, so a single failure ends no canary.
    canary_min_requests: int = Field(200, ge=1, description="STREAMREC_SERVING__CANARY_MIN_REQUESTS")
    # How far the canary's error rate may exceed the served version's (errors per request).
    canary_error_margin: float = Field(0.01, ge=0, description="STREAMREC_SERVING__CANARY_ERROR_MARGIN")
    # The canary's p99 latency may reach the served one's times this plus the slack below: a
    # model twice as slow is a regression, a millisecond of jitter on a fast one is not.
    canary_latency_ratio: float = Field(2.0, ge=0, description="STREAMREC_SERVING__CANARY_LATENCY_RATIO")
    canary_latency_slack_s: float = Field(
        0.05, ge=0, le=MAX_SECONDS, description="STREAMREC_SERVING__CANARY_LATENCY_SLACK_S"
    )
    # Windows running (each closing once both arms answered canary_min_requests in it) in which the
    # canary's p99 must be over that limit before it is ended. A p99 of 200 requests is their
    # third slowest, so a pause of the whole process can put one window over: with 0.3 s pauses
    # three times in 2.5 s, 2 of 12 windows of a model as fast as the served one were; 3 running
    # puts that near 0.5%, and a slower model is over in every window (600 requests an arm).
    canary_latency_windows: int = Field(3, ge=1, description="STREAMREC_SERVING__CANARY_LATENCY_WINDOWS")

    # Click-through per arm (streamrec.serving.clicks): serve records each list it serves during
    # a canary or an A/B test in the feature store's Redis and joins click events carrying its
    # request_id, read from the events topic in this consumer group (one for every instance).
    click_join: bool = Field(False, description="STREAMREC_SERVING__CLICK_JOIN")
    click_group: str = Field("streamrec-serve-clicks", description="STREAMREC_SERVING__CLICK_GROUP")
    # How long a served list may still be clicked: a day covers a feed left open overnight.
    click_ttl_s: int = Field(86_400, ge=1, le=MAX_SECONDS, description="STREAMREC_SERVING__CLICK_TTL_S")
    # The attribution window: a list counts toward its arm's click-through (lists and clicks)
    # once clicked or this long after it was served, so arms are compared on settled lists, not
    # on lists too new to have been clicked yet. Two minutes: most clicks on a shown list come
    # within a minute of showing it, and the event's trip back through the topic adds seconds;
    # a later click still counts, on its list already settled. 0: a list counts when served.
    click_window_s: float = Field(
        120.0, ge=0, le=MAX_SECONDS, description="STREAMREC_SERVING__CLICK_WINDOW_S"
    )
    # Actions that are clicks when an event has no label (an event's label 1 is a click).
    click_actions: tuple[str, ...] = Field(("click",), description="STREAMREC_SERVING__CLICK_ACTIONS")

    # With the click join on: a canary whose clicks per list fall below the served arm's by more
    # than this (0.005: half a point of click-through) is ended too, once both arms have
    # canary_min_lists settled lists (click_window_s); unset, click-through is reported and never judged.
    canary_ctr_margin: float | None = Field(None, ge=0, description="STREAMREC_SERVING__CANARY_CTR_MARGIN")
    # 5,000 lists per arm put the standard error of a 5% click-through near 0.3 points.
    canary_min_lists: int = Field(5000, ge=1, description="STREAMREC_SERVING__CANARY_MIN_LISTS")

    @model_validator(mode="after")
    def _in_flight_covers_workers(self) -> ServingConfig:
        if self.max_in_flight < self.workers:
            raise ValueError(
                f"max_in_flight ({self.max_in_flight}) must be at least workers ({self.workers})"
            )
        return self

    @model_validator(mode="after")
    def _window_within_ttl(self) -> ServingConfig:
        if self.click_window_s > self.click_ttl_s:
            raise ValueError(
                f"click_window_s ({self.click_window_s:g}) must be at most click_ttl_s ({self.click_ttl_s}): "
                "a list is no longer joined to its clicks after click_ttl_s"
            )
        return self
