"""Stand-in model servers for the demo: each answers every path with the version it is.

Kept behind one function, :func:`start_demo_backends`, so the demo can switch to the real
inference backend without changing anything else.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from aiohttp import web

__all__ = ["DemoBackends", "build_version_app", "start_demo_backends"]

VERSION = web.AppKey("version", str)


async def _answer(request: web.Request) -> web.Response:
    return web.json_response({"version": request.app[VERSION], "path": request.path})


def build_version_app(version: str) -> web.Application:
    app = web.Application()
    app[VERSION] = version
    app.router.add_route("*", "/{tail:.*}", _answer)
    return app


@dataclass
class DemoBackends:
    """Running backends: ``ports[version]`` is where each one listens on ``host``."""

    host: str
    ports: dict[str, int]
    _runners: list[web.AppRunner] = field(default_factory=list, repr=False)

    async def stop(self) -> None:
        await asyncio.gather(*(runner.cleanup() for runner in self._runners))
        self._runners.clear()


async def start_demo_backends(
    versions: Sequence[str] = ("v1", "v2"), *, host: str = "127.0.0.1"
) -> DemoBackends:
    """One backend per version, each on a free loopback port."""
    backends = DemoBackends(host, {})
    try:
        for version in versions:
            runner = web.AppRunner(build_version_app(version), access_log=None)
            await runner.setup()
            backends._runners.append(runner)
            await web.TCPSite(runner, host, 0).start()
            backends.ports[version] = int(runner.addresses[0][1])
    except BaseException:
        await backends.stop()
        raise
    return backends
