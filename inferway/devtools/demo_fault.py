"""A misbehaving demo backend, for the rollout scene: a small HTTP front on its own port that
answers ``503`` for a share of requests and forwards the rest to a real backend (optionally
after a delay), so every answer that is not an injected failure is still a real inference.

Why a front and not Envoy's ``fault:``: aborts Envoy injects never reach the upstream
cluster's stats, so the rollout analysis (which reads those stats) would not see them; an
upstream that really fails is what a rollback must catch.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

__all__ = ["DemoFault", "FaultFront", "start_fault_front"]

_HOP_BY_HOP = frozenset({"connection", "content-length", "transfer-encoding", "keep-alive"})


@dataclass(frozen=True)
class DemoFault:
    """How a demo backend misbehaves: ``error_rate`` of its requests (0..1) answer 503,
    every other one waits ``delay_ms`` before it is served."""

    error_rate: float = 0.0
    delay_ms: float = 0.0
    seed: int = 3

    def __post_init__(self) -> None:
        if not 0.0 <= self.error_rate <= 1.0:
            raise ValueError(f"DemoFault.error_rate must be within 0..1, got {self.error_rate}")
        if self.delay_ms < 0:
            raise ValueError(f"DemoFault.delay_ms must not be negative, got {self.delay_ms}")


@dataclass
class FaultFront:
    """A running front: ``port`` is where clients (Envoy) connect."""

    port: int
    _runner: web.AppRunner = field(repr=False)
    _session: aiohttp.ClientSession = field(repr=False)

    async def stop(self) -> None:
        await self._runner.cleanup()
        await self._session.close()


async def start_fault_front(
    target_port: int, fault: DemoFault, host: str = "127.0.0.1"
) -> FaultFront:
    """Listen on a free loopback port and forward to ``host:target_port`` with ``fault``."""
    rng = random.Random(fault.seed)
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30), auto_decompress=False)
    target = f"http://{host}:{target_port}"

    async def forward(request: web.Request) -> web.StreamResponse:
        if rng.random() < fault.error_rate:
            return web.Response(status=503, text="injected failure (demo fault)\n")
        if fault.delay_ms:
            await asyncio.sleep(fault.delay_ms / 1000)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        async with session.request(
            request.method, target + request.path_qs, headers=headers, data=await request.read()
        ) as upstream:
            body = await upstream.read()
            kept = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP}
            return web.Response(status=upstream.status, body=body, headers=kept)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        await session.close()
        raise
    return FaultFront(int(runner.addresses[0][1]), runner, session)
