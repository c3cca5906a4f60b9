"""A small HTTP/1.1 server that Envoy calls on keep-alive connections (an asyncio protocol and
httptools, no framework): the endpoint picker's ext_authz lane (picker/http_lane.py) and the
LLM processor's reports port (llm/report_lane.py). Each answers in a few microseconds of
Python where a gRPC call cost hundreds.

``LaneServer`` listens and closes every connection on stop; ``LaneConnection`` parses one
connection's requests in order (a request that is not HTTP closes it) and hands each whole
request (``url``, ``body``) to its subclass's ``on_message_complete``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Self, cast

import httptools

__all__ = ["LaneConnection", "LaneServer"]

log = logging.getLogger(__name__)


class LaneServer:
    """Listens on ``host:port`` (port 0: the OS picks; ``port`` tells). ``what`` names the
    server in its errors and logs, ``hint`` says where its address is set."""

    def __init__(self, host: str, port: int, what: str, hint: str = "") -> None:
        self.host = host
        self.port = port
        self.what = what
        self.hint = hint
        self.requests = 0
        self.errors = 0
        self.connections: set[asyncio.Transport] = set()
        self._server: asyncio.Server | None = None

    def connection(self) -> asyncio.Protocol:
        """The protocol of one new connection (subclasses say which)."""
        raise TypeError(f"{type(self).__name__} does not say what serves a connection")

    async def start(self) -> Self:
        """Listens; an address that cannot be bound raises OSError naming it."""
        loop = asyncio.get_running_loop()
        factory: Callable[[], asyncio.Protocol] = self.connection
        try:
            self._server = await loop.create_server(factory, self.host, self.port, backlog=1024)
        except OSError as error:
            raise OSError(
                error.errno,
                f"{self.what}: cannot listen on {self.host}:{self.port}: {error.strerror}"
                + (f" ({self.hint})" if self.hint else ""),
            ) from error
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            server.close()
            for transport in list(self.connections):
                transport.close()
            self.connections.clear()
            await server.wait_closed()


class LaneConnection(asyncio.Protocol):
    """One Envoy connection, its requests in order (httptools calls back per message)."""

    def __init__(self, server: LaneServer) -> None:
        self.lane = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.lane.connections.add(self.transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.lane.connections.discard(self.transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as error:
            log.warning("%s: a bad request from Envoy: %s", self.lane.what, error)
            if self.transport is not None:
                self.transport.close()

    def on_message_begin(self) -> None:
        self.url = b""
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
