"""A stand-in score endpoint for the load clients' tests: it sheds every n-th request with 503."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web


@contextlib.asynccontextmanager
async def shedding_server(every: int) -> AsyncIterator[str]:
    """``POST /score`` on the running loop, answering every ``every``-th request 503; its URL."""
    calls = 0

    async def score(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        await request.read()
        return web.json_response({"scores": [0.5]}, status=503 if calls % every == 0 else 200)

    app = web.Application()
    app.router.add_post("/score", score)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/score"
    finally:
        await runner.cleanup()
