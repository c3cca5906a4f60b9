"""Small aiohttp servers for tests, on loopback: an app in, a listening runner and its port out.
The caller stops it with ``await runner.cleanup()``."""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

__all__ = ["answer_every_path", "start_site"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def answer_every_path(handler: Handler) -> web.Application:
    """An app where ``handler`` answers every method on every path."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    return app


async def start_site(
    app: web.Application,
    *,
    port: int = 0,
    ssl_context: ssl.SSLContext | None = None,
    reuse_address: bool | None = None,
    **runner_options: Any,
) -> tuple[web.AppRunner, int]:
    """Serve ``app`` on 127.0.0.1 (``port`` 0: a free one), without an access log; returns the
    runner and the port it listens on. ``runner_options`` go to ``web.AppRunner``."""
    runner = web.AppRunner(app, access_log=None, **runner_options)
    await runner.setup()
    site = web.TCPSite(
        runner, "127.0.0.1", port, ssl_context=ssl_context, reuse_address=reuse_address
    )
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, int(runner.addresses[0][1])
