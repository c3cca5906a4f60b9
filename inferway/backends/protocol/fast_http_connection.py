"""One connection of the fast front end (fast_http.py): requests parsed with httptools and
answered in one write each, or the whole connection handed to aiohttp at the first request the
hot path does not take (see fast_http.py for which)."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from functools import partial
from typing import Any, cast

import httptools

from inferway.backends.batching.client_gone import GoneCheck, client_gone_check
from inferway.backends.protocol.fast_http_front import FrontEnd
from inferway.backends.protocol.fast_wire import (
    HOT_SKIP_HEADERS,
    Encoded,
    FastCall,
    RepeatedHead,
    answer_bytes,
    error_body,
    head_end,
    repeatable_head,
    response_bytes,
    take_repeats,
)
from inferway.backends.protocol.http_server import HTTP
from inferway.backends.protocol.peer import transport_gone_check
from inferway.backends.serving.failures import Failure, classify_error
from inferway.backends.telemetry import tracing

__all__ = ["FastHttpConnection"]

log = logging.getLogger("inferway.backends.http")

_TIMED_OUT = error_body("the request was not sent in time (its head or body came too slowly)")
_REQUEST_ID = tracing.REQUEST_ID_HEADER


class _HandOff(Exception):
    """Raised in a parser callback to stop parsing: the rest of the connection is aiohttp's."""


class _Request:
    __slots__ = ("call", "http10", "keep_alive")

    def __init__(self, call: FastCall, keep_alive: bool, http10: bool) -> None:
        self.call = call
        self.keep_alive = keep_alive
        self.http10 = http10


class FastHttpConnection(asyncio.Protocol):
    """One client connection, until it closes or is handed to aiohttp."""

    def __init__(self, front: FrontEnd) -> None:
        self._front = front
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._raw = bytearray()  # from the start of the first request not yet parsed whole
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._route: tuple[str, str | None] | None = None
        self._head: RepeatedHead | None = None  # the last head parsed whole, to repeat
        self._queue: collections.deque[_Request] = collections.deque()
        self._serving: _Request | None = None  # answered one at a time, in order
        self._task: asyncio.Future[Any] | None = None  # its task, or its queued batch entry
        self._handoff = False  # parsing stopped; the rest goes to aiohttp once answered
        self._closing = False
        self._paused = False  # the client is not reading its answers: serve no more for now
        self.idle_since: float | None = time.monotonic()
        self._deadline: float | None = None  # the request being read must be whole by then
        self._gone: GoneCheck | None = None  # the executor's hang-up check (client_gone.py)

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self._gone = transport_gone_check(transport)
        self._front.connections.add(self)

    def data_received(self, data: bytes) -> None:
        self.idle_since = None
        if not self._raw and not self._handoff and not self._closing:
            # between requests: one that repeats this connection's last head, or the last
            # head any connection sent (a new connection per request repeats that), is taken
            # without the parser
            head = self._head or self._front.last_head
            if head is not None:
                data = self._take_repeats(data, head)
        if data:
            self._raw += data
            if self._handoff:
                return
            try:
                self._parser.feed_data(data)
            except httptools.HttpParserError:
                # A request it does not serve, or one it cannot parse: aiohttp answers it (400
                # for malformed HTTP) once the requests before it are answered.
                self._handoff = True
        if self._handoff:
            self._maybe_hand_off()
        elif self._serving is None and not self._queue:
            self.idle_since = time.monotonic()

    def _take_repeats(self, data: bytes, head: RepeatedHead) -> bytes:
        """Between requests (the parser has nothing pending), serve the requests that repeat
        the last head byte for byte without parsing them; the rest of ``data``."""
        bodies, taken = take_repeats(data, head)
        self._front.repeated_heads += len(bodies)
        model, version = head.route
        for body in bodies:
            call = FastCall(model, version, head.headers, body, self._front.plans)
            self._accept(_Request(call, head.keep_alive, head.http10))
        return data[taken:] if taken else data

    def eof_received(self) -> bool | None:
        # A client that half-closes has gone away, as aiohttp reads it: the transport closes.
        # Its requests are dropped now, not when connection_lost runs a pass later: a batch
        # launched in between would compute them.
        self._drop_requests()
        return None

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._serving is None and self._queue:
            self._next()

    def connection_lost(self, exc: Exception | None) -> None:
        self._front.connections.discard(self)
        self._drop_requests()

    def _drop_requests(self) -> None:
        self._queue.clear()
        if self._task is not None:  # the client went away: drop (and count) its request
            self._task.cancel()

    # -- httptools callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._deadline = time.monotonic() + self._front.header_timeout_s
        self._url = b""
        self._headers = {}
        self._body = []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        if key in HOT_SKIP_HEADERS:
            raise _HandOff
        self._headers[key] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        route = self._front.route(self._url) if self._parser.get_method() == b"POST" else None
        if route is None or self._parser.should_upgrade() or self._closing:
            raise _HandOff
        if int(self._headers.get("content-length", "0")) > self._front.max_body_bytes:
            raise _HandOff  # aiohttp refuses it (413) before reading it, as it always has
        self._route = route
        self._deadline = time.monotonic() + self._front.body_timeout_s

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._deadline = None
        body = b"".join(self._body)
        head_size = head_end(self._raw)
        assert self._route is not None
        model, version = self._route
        call = FastCall(model, version, self._headers, body, self._front.plans)
        self._body = []
        http10 = self._parser.get_http_version() == "1.0"
        keep_alive = self._parser.should_keep_alive()
        head = repeatable_head(
            self._raw, head_size, body, self._route, self._headers, http10, keep_alive
        )
        if head is not None:
            self._front.last_head = head
        if keep_alive:
            self._head = head
        del self._raw[: head_size + len(body)]
        self._accept(_Request(call, keep_alive, http10))

    def _accept(self, request: _Request) -> None:
        self._queue.append(request)
        if self._serving is None and not self._paused:
            self._next()

    # -- serving -----------------------------------------------------------------------

    def _next(self) -> None:
        request = self._queue.popleft()
        self._serving = request
        call = request.call
        if not self._front.plain(call):
            self._task = asyncio.get_running_loop().create_task(self._serve(request))
            return
        # No span, no recorded digest, no deadline to bound: the core's callback path, no
        # task per request (as the gRPC stream is served); the outcome comes to _finish.
        token = client_gone_check.set(self._gone)
        try:
            queued = self._front.core.submit(
                call, HTTP, partial(self._finish, request), request_id=call.headers.get(_REQUEST_ID)
            )
        finally:
            client_gone_check.reset(token)
        if self._serving is request:  # not answered already (refused before queueing)
            self._task = queued

    async def _serve(self, request: _Request) -> None:
        core = self._front.core
        call = request.call
        request_id = call.headers.get(_REQUEST_ID)
        client_gone_check.set(self._gone)  # this task's context only
        try:
            parent = (
                tracing.extract_context(call.headers) if tracing.is_tracing(core.tracer) else None
            )
            encoded, failure = await core.infer(call, HTTP, parent=parent, request_id=request_id)
        except asyncio.CancelledError:
            return  # the client went away (the core counted it)
        except Exception as exc:  # a fault here, not in the request: answer it, as aiohttp
            log.exception("fast HTTP front end failed on %s", call.model_name)
            encoded, failure = None, classify_error(exc, request_id=request_id)
        self._finish(request, encoded, failure)

    def _finish(self, request: _Request, encoded: Encoded | None, failure: Failure | None) -> None:
        self._serving = None
        self._task = None
        keep_alive = request.keep_alive and not self._closing
        self._write(encoded, failure, request, request.call.headers.get(_REQUEST_ID), keep_alive)
        if not keep_alive:
            self._close()
        elif self._queue:
            if not self._paused:
                self._next()
        elif self._handoff:
            self._maybe_hand_off()
        else:
            self.idle_since = time.monotonic()

    def _write(
        self,
        encoded: Encoded | None,
        failure: Failure | None,
        request: _Request,
        request_id: str | None,
        keep_alive: bool,
    ) -> None:
        report = self._front.core.load_report()
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(
                answer_bytes(encoded, failure, report, request_id, keep_alive, request.http10)
            )

    def _maybe_hand_off(self) -> None:
        """Give the connection to aiohttp once every request before the handed-off one is
        answered: the bytes from that request on are replayed to aiohttp's handler."""
        if self._serving is not None or self._queue or self._transport is None:
            return
        transport = self._transport
        self._transport = None
        self._front.connections.discard(self)
        if self._front.closing or transport.is_closing():
            transport.close()
            return
        handler = self._front.aiohttp_server()
        transport.set_protocol(handler)
        handler.connection_made(transport)
        data, self._raw = bytes(self._raw), bytearray()
        if data:
            handler.data_received(data)

    def _close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def close_if_idle(self, now: float | None) -> None:
        """Shutting down (``now`` None) or sweeping: close this connection if it has nothing
        in flight and, when sweeping, has idled too long, or has taken too long to send the
        request it is sending (a 408 first: no answer is owed before it)."""
        if now is None:
            self._closing = True
        if self._serving is not None or self._queue or self._handoff:
            return
        if now is None:
            self._close()
        elif self._deadline is not None:
            if now > self._deadline:
                self._timed_out()
        elif self.idle_since is not None and now - self.idle_since > self._front.idle_timeout_s:
            self._close()

    def _timed_out(self) -> None:
        self._front.timed_out += 1
        if self._transport is not None and not self._transport.is_closing():
            answer = response_bytes(
                408, b"application/json; charset=utf-8", _TIMED_OUT, [], keep_alive=False
            )
            self._transport.write(answer)
        self._close()

    def abort(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._transport is not None:
            self._transport.abort()
