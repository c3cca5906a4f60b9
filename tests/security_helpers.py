"""Test helpers for the security tests: an echo backend that shows the headers it received.
Everything binds loopback, everything is stopped by the caller. Certificates come from
``inferway.pki`` (``build_ca`` / ``build_certificate``)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from aiohttp import web

from tests.helpers import poll_until  # re-exported for the tests importing them here

__all__ = [
    "EchoBackend",
    "poll_until",
    "start_echo_backend",
]


@dataclass
class EchoBackend:
    """An HTTP server answering every request with the request's headers as JSON."""

    runner: web.AppRunner
    port: int
    seen: list[dict[str, str]]

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start_echo_backend() -> EchoBackend:
    seen: list[dict[str, str]] = []

    async def echo(request: web.Request) -> web.Response:
        headers = {k.lower(): v for k, v in request.headers.items()}
        seen.append(headers)
        return web.Response(
            text=json.dumps({"path": request.path}), content_type="application/json"
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", echo)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server
    assert server is not None and server.sockets
    return EchoBackend(runner, int(server.sockets[0].getsockname()[1]), seen)
