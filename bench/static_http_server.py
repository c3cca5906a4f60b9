"""The load generator's floor: an HTTP/1.1 server that answers every request with the same
KServe v2 JSON body at once (no model, no batching), for measuring what a load generator
itself adds to the latencies it reports. httptools parses, uvloop runs the loop.

With ``--close`` a request that asks for ``Connection: close`` is answered with it and the
connection closed, as RFC 9112 (9.6) requires of a server and as every real server does;
without it the client closes first.

    python bench/static_http_server.py PORT [--close]
"""

from __future__ import annotations

import asyncio
import sys
from typing import cast

import httptools
import uvloop

_BODY = (
    b'{"model_name":"floor","outputs":[{"name":"y","datatype":"FP32","shape":[1,1],"data":[0.0]}]}'
)
_RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
    + str(len(_BODY)).encode()
    + b"\r\n\r\n"
    + _BODY
)
_RESPONSE_CLOSE = _RESPONSE.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1)


class _Connection(asyncio.Protocol):
    close = False
    """Close a connection whose request asked for it, after answering (``--close``)."""

    def __init__(self) -> None:
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            if self._transport is not None:
                self._transport.close()

    def on_message_complete(self) -> None:
        if self._transport is None:
            return
        if self.close and not self._parser.should_keep_alive():
            self._transport.write(_RESPONSE_CLOSE)
            self._transport.close()
        else:
            self._transport.write(_RESPONSE)


async def _serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Connection, "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


def main() -> None:
    if len(sys.argv) not in (2, 3) or sys.argv[2:] not in ([], ["--close"]):
        raise SystemExit("usage: static_http_server.py PORT [--close]")
    _Connection.close = sys.argv[2:] == ["--close"]
    uvloop.run(_serve(int(sys.argv[1])))


if __name__ == "__main__":
    main()
