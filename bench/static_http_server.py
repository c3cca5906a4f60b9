"""The load generator's floor: an HTTP/1.1 server that answers every request with the same
KServe v2 JSON body at once (no model, no batching), for measuring what a load generator
itself adds to the latencies it reports. httptools parses, uvloop runs the loop.

With ``--close`` a request that asks for ``Connection: close`` is answered with it and the
connection closed, as RFC 9112 (9.6) requires of a server and as every real server does;
without it the client closes first.

Three variants show how a co-located client's own speed depends on the server's shape, not only
on its cost (issue 37; docs/serving-performance.md):

- ``--busy-us N``: spend N µs of CPU on the event loop before each answer, one request at a
  time: a serial server that becomes the bottleneck at 1/N requests a second;
- ``--spin-us N``: after each request, keep polling the loop (never sleeping in epoll) for N
  µs: a busy-polling server that answers at once but keeps a core occupied while requests come;
- ``--sleep-us N``: sleep N µs on the event loop before each answer, one request at a time:
  serial like ``--busy-us``, paced the same way, but leaving its core free while it waits (it
  separates the pacing of the answers from the occupied core).

    python bench/static_http_server.py PORT [--close] [--busy-us N | --sleep-us N] [--spin-us N]
"""

from __future__ import annotations

import argparse
import asyncio
import time
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


class _Spin:
    """``--spin-us``: keep the loop polling (a callback that reschedules itself, so uvloop
    polls without blocking) until ``spin_s`` after the last request."""

    spin_s = 0.0
    until = 0.0
    running = False

    @classmethod
    def extend(cls) -> None:
        cls.until = time.perf_counter() + cls.spin_s
        if not cls.running:
            cls.running = True
            asyncio.get_running_loop().call_soon(cls._poll)

    @classmethod
    def _poll(cls) -> None:
        if time.perf_counter() < cls.until:
            asyncio.get_running_loop().call_soon(cls._poll)
        else:
            cls.running = False


class _Connection(asyncio.Protocol):
    close = False
    """Close a connection whose request asked for it, after answering (``--close``)."""
    busy_s = 0.0
    """CPU spent on the loop before each answer (``--busy-us``)."""
    sleep_s = 0.0
    """Time slept on the loop before each answer, its core left free (``--sleep-us``)."""

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
        if self.busy_s:
            end = time.perf_counter() + self.busy_s
            while time.perf_counter() < end:
                pass
        if self.sleep_s:
            time.sleep(self.sleep_s)  # blocks the loop on purpose: a serial server
        if _Spin.spin_s:
            _Spin.extend()
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
    parser = argparse.ArgumentParser(description="A fixed KServe v2 JSON answer to every request.")
    parser.add_argument("port", type=int)
    parser.add_argument("--close", action="store_true", help="close on Connection: close")
    parser.add_argument("--busy-us", type=float, default=0.0, help="CPU per request, serially")
    parser.add_argument("--spin-us", type=float, default=0.0, help="poll this long after each")
    parser.add_argument("--sleep-us", type=float, default=0.0, help="sleep per request, serially")
    args = parser.parse_args()
    if min(args.busy_us, args.spin_us, args.sleep_us) < 0:
        parser.error("--busy-us, --spin-us and --sleep-us must be >= 0")
    _Connection.close = args.close
    _Connection.busy_s = args.busy_us / 1e6
    _Connection.sleep_s = args.sleep_us / 1e6
    _Spin.spin_s = args.spin_us / 1e6
    uvloop.run(_serve(args.port))


if __name__ == "__main__":
    main()
