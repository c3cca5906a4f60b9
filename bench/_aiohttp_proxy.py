"""A plain aiohttp reverse proxy, written only as a comparison point for gateway_overhead.py.

It does what the benchmark asks of Envoy and nothing more: forward method, path, headers and
body to one upstream over a keep-alive connection pool, and stream the answer back. No
retries, no balancing, no config: the fastest honest Python proxy, so the table shows what a
C++ data plane buys over it.
"""

from __future__ import annotations

from multiprocessing.connection import Connection

__all__ = ["proxy_main"]

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


def proxy_main(upstream_port: int, conn: Connection) -> None:
    """Serve on a free loopback port; send the port over ``conn``; stop when ``conn`` speaks."""
    import asyncio

    import aiohttp
    import uvloop
    from aiohttp import web

    upstream = f"http://127.0.0.1:{upstream_port}"

    async def run() -> None:
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60),
            auto_decompress=False,
        )

        async def forward(request: web.Request) -> web.Response:
            headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
            body = await request.read()
            async with session.request(
                request.method, upstream + request.path_qs, headers=headers, data=body or None
            ) as answer:
                payload = await answer.read()
                out = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP_BY_HOP}
                return web.Response(status=answer.status, body=payload, headers=out)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        conn.send(runner.addresses[0][1])
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, conn.recv)
        await runner.cleanup()
        await session.close()

    uvloop.run(run())
