"""A fast HTTP/1.1 front end for the hot path: ``POST /v2/models/{m}[/versions/{v}]/infer``.

aiohttp's per-request machinery (request and response objects, router, middleware, the stream
writer) costs more event-loop CPU than the model at small batch sizes, and the event loop is
the bottleneck under load. This protocol parses with httptools (llhttp, the C parser uvicorn
uses), hands the infer request straight to :class:`ServingCore` and writes the whole answer in
one ``transport.write``. Its listening sockets take every waiting connection in a pass of the
loop (accept_all.py; uvloop's own accept takes one). Anything else (another route or method, a
chunked body, ``Expect: 100-continue``, ``Prefer: respond-async``, an upgrade, a malformed
request) is handed to aiohttp before a byte of answer is written: the connection gets an
aiohttp RequestHandler fed with every byte of it not yet answered, and stays aiohttp's from
then on, so every other route keeps exactly its aiohttp behaviour.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import Any

from aiohttp import web_server

from inferway.backends.protocol.accept_all import AcceptAll
from inferway.backends.protocol.fast_http_connection import FastHttpConnection
from inferway.backends.protocol.fast_http_front import FrontEnd
from inferway.backends.serving.core import ServingCore

__all__ = ["FastHttpServer"]


class FastHttpServer(FrontEnd):
    """The listening socket of the fast front end over ``core``; requests it does not serve
    go to connections of ``aiohttp_server`` (an AppRunner's ``server``)."""

    def __init__(self, core: ServingCore, aiohttp_server: web_server.Server) -> None:
        super().__init__(core, aiohttp_server)
        self._sweep_every = min(self.header_timeout_s, self.body_timeout_s, self.idle_timeout_s) / 5
        self._server: asyncio.Server | None = None
        self._acceptor: AcceptAll | None = None
        self._sweeper: asyncio.TimerHandle | None = None

    async def start(
        self,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None,
        backlog: int,
        reuse_port: bool,
    ) -> int:
        """Listen (as aiohttp's TCPSite would: same TLS, backlog, SO_REUSEPORT); the port.
        The loop binds the sockets; ``AcceptAll`` listens and accepts on them."""
        loop = asyncio.get_running_loop()

        def connection() -> FastHttpConnection:
            return FastHttpConnection(self)

        self._server = await loop.create_server(
            connection,
            host,
            port,
            ssl=ssl_context,
            backlog=backlog,
            reuse_port=reuse_port or None,
            start_serving=False,
        )
        self._acceptor = AcceptAll(
            loop, self._server.sockets, connection, ssl_context=ssl_context, backlog=backlog
        )
        self._sweeper = loop.call_later(self._sweep_every, self._sweep)
        sockname: Any = self._server.sockets[0].getsockname()
        return int(sockname[1])

    def _sweep(self) -> None:
        now = time.monotonic()
        for conn in list(self.connections):
            conn.close_if_idle(now)
        self._sweeper = asyncio.get_running_loop().call_later(self._sweep_every, self._sweep)

    async def close(self, grace: float) -> None:
        """Stop listening, close idle connections, let requests in flight finish (up to
        ``grace`` seconds), then drop what is left."""
        self.closing = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._acceptor is not None:
            self._acceptor.close()
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.close_if_idle(None)
        deadline = time.monotonic() + grace
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for conn in list(self.connections):
            conn.abort()
        if self._server is not None:
            await self._server.wait_closed()
