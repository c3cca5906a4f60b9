"""Test helpers for the security tests: an echo backend that shows the headers it received.
Everything binds loopback, everything is stopped by the caller. Certificates come from
``inferway.pki`` (``build_ca`` / ``build_certificate``)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from aiohttp import web

from tests.aiohttp_sites import answer_every_path, start_site
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

    runner, port = await start_site(answer_every_path(echo))
    return EchoBackend(runner, port, seen)
