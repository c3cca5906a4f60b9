"""A cheap OpenAI-style SSE engine and a cheap streaming client for the LLM overhead bench:
raw asyncio protocols on uvloop, pre-encoded chunks, no HTTP library.

Why: with aiohttp on both ends of a 2-core host, the engine's and the client's own CPU grew
direct TTFT from 21 to 50-60 ms at 100 streams, burying the few milliseconds a gateway adds.
Here one chunk costs a timer and a write, and the client parses only what it must.

Both also stamp the path itself with ``time.monotonic_ns()`` (CLOCK_MONOTONIC: one clock
for every process on the host): the engine sends, as response headers, when it had the
whole request (``x-engine-recv-ns``) and when it wrote the first chunk
(``x-engine-first-ns``); the client knows when it sent the request and when the first
content arrived. Path time = (engine recv - client send) + (client first - engine first):
what lies between client and engine (kernel, Envoy, the processor), without the engine's
own timer lateness, which moves with the engine's load whatever the path.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from multiprocessing.connection import Connection
from typing import Any, cast

__all__ = ["client_main", "engine_main"]

_INCLUDE_USAGE = re.compile(rb'"include_usage"\s*:\s*true')


def _framed(payload: bytes) -> bytes:
    """One HTTP/1.1 chunk (the engine answers ``transfer-encoding: chunked``)."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _event(document: dict[str, Any]) -> bytes:
    return _framed(b"data: " + json.dumps(document, separators=(",", ":")).encode() + b"\n\n")


class _EngineProtocol(asyncio.Protocol):
    """One keep-alive connection: one request at a time (Envoy and the client never pipeline)."""

    def __init__(self, engine: _Engine) -> None:
        self.engine = engine
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        self.buffer += data
        if self.busy:
            return
        body = _whole_request(self.buffer)
        if body is None:
            return
        self.buffer.clear()
        self.busy = True
        usage = _INCLUDE_USAGE.search(body) is not None
        loop = asyncio.get_running_loop()
        loop.call_later(self.engine.first_token_s, self._first, now, usage)

    def _first(self, received_ns: int, usage: bool) -> None:
        if self.transport is None:
            return
        first_ns = time.monotonic_ns()
        head = (
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\nx-engine-recv-ns: %d\r\nx-engine-first-ns: %d\r\n\r\n"
            % (received_ns, first_ns)
        )
        self.transport.write(head + self.engine.token)
        self._next(1, usage)

    def _next(self, sent: int, usage: bool) -> None:
        engine = self.engine
        if sent < engine.tokens:
            asyncio.get_running_loop().call_later(engine.token_s, self._token, sent, usage)
            return
        if self.transport is not None:
            self.transport.write(engine.tail_usage if usage else engine.tail)
        self.busy = False
        if self.buffer:  # a next request already arrived whole
            self.data_received(b"")

    def _token(self, sent: int, usage: bool) -> None:
        if self.transport is None:
            self.busy = False
            return
        self.transport.write(self.engine.token)
        self._next(sent + 1, usage)


def _whole_request(buffer: bytearray) -> bytes | None:
    """The body once the request is whole (content-length or chunked), else None."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = bytes(buffer[:end]).lower()
    start = end + 4
    match = re.search(rb"\r\ncontent-length:\s*(\d+)", head)
    if match is not None:
        size = int(match.group(1))
        return bytes(buffer[start : start + size]) if len(buffer) >= start + size else None
    if b"transfer-encoding: chunked" not in head:
        return b""
    body = bytearray()
    at = start
    while True:
        line_end = buffer.find(b"\r\n", at)
        if line_end < 0:
            return None
        size = int(bytes(buffer[at:line_end]).split(b";")[0], 16)
        if size == 0:
            return bytes(body) if buffer.find(b"\r\n", line_end + 2) >= 0 else None
        if len(buffer) < line_end + 2 + size + 2:
            return None
        body += buffer[line_end + 2 : line_end + 2 + size]
        at = line_end + 2 + size + 2


class _Engine:
    def __init__(self, first_token_s: float, token_s: float, tokens: int) -> None:
        self.first_token_s, self.token_s, self.tokens = first_token_s, token_s, tokens
        delta = {"model": "bench", "choices": [{"index": 0, "delta": {"content": "tok "}}]}
        self.token = _event(delta)
        usage = {"prompt_tokens": 64, "completion_tokens": tokens}
        done = _framed(b"data: [DONE]\n\n") + b"0\r\n\r\n"
        self.tail = done
        self.tail_usage = _event({"model": "bench", "choices": [], "usage": usage}) + done


def engine_main(first_token_s: float, token_s: float, tokens: int, conn: Connection) -> None:
    """Serve on a free port (sent on ``conn``) until ``conn`` says stop."""
    import uvloop

    async def run() -> None:
        engine = _Engine(first_token_s, token_s, tokens)
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _EngineProtocol(engine), "127.0.0.1", 0)
        conn.send(server.sockets[0].getsockname()[1])
        await loop.run_in_executor(None, conn.recv)
        server.close()

    uvloop.run(run())


class _ClientProtocol(asyncio.Protocol):
    """One keep-alive connection sending one streamed request after another."""

    def __init__(self, request: bytes, results: dict[str, Any]) -> None:
        self.request = request
        self.results = results
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[None] | None = None
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError("the connection closed mid-answer"))
        if not self.lost.done():
            self.lost.set_result(None)

    def send(self) -> asyncio.Future[None]:
        assert self.transport is not None
        self.buffer = bytearray()
        self.body_at = -1
        self.length = -1
        self.status = 0
        self.stamps: tuple[int, int] | None = None
        self.first_ns = 0
        self.done = asyncio.get_running_loop().create_future()
        self.sent_ns = time.monotonic_ns()
        self.transport.write(self.request)
        return self.done

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        buffer = self.buffer
        scan_from = max(0, len(buffer) - 16)
        buffer += data
        if self.body_at < 0:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            self.body_at = scan_from = end + 4
            self._head(bytes(buffer[:end]))
        if not self.first_ns and buffer.find(b'"content"', scan_from) >= 0:
            self.first_ns = now
        finished = (
            len(buffer) - self.body_at >= self.length
            if self.length >= 0
            else buffer.endswith(b"\r\n0\r\n\r\n")
        )
        if finished and self.done is not None and not self.done.done():
            self.done.set_result(None)

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        self.status = int(lines[0].split()[1])
        fields = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            fields[name.strip().lower()] = value.strip()
        if b"content-length" in fields:
            self.length = int(fields[b"content-length"])
        recv, first = fields.get(b"x-engine-recv-ns"), fields.get(b"x-engine-first-ns")
        if recv is not None and first is not None:
            self.stamps = int(recv), int(first)


async def _stream_loop(
    host: str, port: int, request: bytes, start: float, deadline: float, results: dict[str, Any]
) -> None:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(start)
    protocol: _ClientProtocol | None = None
    while time.monotonic() < deadline:
        if protocol is None or protocol.transport is None:
            _, protocol = await loop.create_connection(
                lambda: _ClientProtocol(request, results), host, port
            )
        try:
            await protocol.send()
        except ConnectionError:
            results["errors"] += 1
            protocol = None
            continue
        answer = bytes(protocol.buffer[protocol.body_at :])
        if protocol.status != 200 or not protocol.first_ns:
            results["errors"] += 1
            continue
        results["ttft_ns"].append(protocol.first_ns - protocol.sent_ns)
        if protocol.stamps is not None:
            recv, first = protocol.stamps
            results["request_leg_ns"].append(recv - protocol.sent_ns)
            results["answer_leg_ns"].append(protocol.first_ns - first)
            results["path_ns"].append((recv - protocol.sent_ns) + (protocol.first_ns - first))
            results["path_sent_ns"].append(protocol.sent_ns)
        results["tokens"] += answer.count(b'"content"')
        results["usage_seen"] += answer.count(b'"usage"')
    if protocol is not None and protocol.transport is not None:
        protocol.transport.close()


def client_main(
    host: str,
    port: int,
    path: str,
    body: bytes,
    concurrency: int,
    duration: float,
    stagger: float,
    conn: Connection,
) -> None:
    """``concurrency`` keep-alive connections, each streaming one request after another for
    ``duration`` s; sends TTFTs and path times (ns), token and usage-chunk counts, errors.

    The connections start spread over ``stagger`` s (one stream's length): started at once,
    streams of one fixed length would arrive in waves of ``concurrency`` requests for the
    whole run, which measures a burst's queue rather than concurrent streams."""
    import uvloop

    request = (
        b"POST %s HTTP/1.1\r\nhost: %s:%d\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % (path.encode(), host.encode(), port, len(body))
    ) + body

    async def run() -> dict[str, Any]:
        results: dict[str, Any] = {
            "ttft_ns": [],
            "path_ns": [],
            "path_sent_ns": [],
            "request_leg_ns": [],
            "answer_leg_ns": [],
            "tokens": 0,
            "usage_seen": 0,
            "errors": 0,
        }
        started = time.monotonic()
        results["started_ns"] = time.monotonic_ns()
        deadline = started + duration
        await asyncio.gather(
            *(
                _stream_loop(host, port, request, i * stagger / concurrency, deadline, results)
                for i in range(concurrency)
            )
        )
        results["elapsed"] = time.monotonic() - started
        return results

    conn.send(uvloop.run(run()))
