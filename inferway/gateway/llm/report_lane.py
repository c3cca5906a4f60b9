"""The LLM processor's reports port: Envoy's Lua filter (xds/translate/llm_stream.py) calls
it here, plain HTTP/1.1 over Envoy's keep-alive connections:

- ``POST /inferway/llm/admit`` (``llm.transport: http``): a request's whole body, with the
  headers the filter forwards (``x-inferway-path``, the client key); the answer says where it
  goes or what its client gets instead (admission_http.py);
- ``POST /inferway/llm/notice``: a request Envoy's Lua filter admitted itself
  (llm_local_admit.py), told without waiting: the processor registers its stream;
- ``POST /inferway/llm/report``: a report on an answer (a JSON line, then a plain answer's
  bytes). Each gets an empty 200 once the processor has taken it: for a final report, once
  the request is recorded (the Lua filter waits for that before it passes the answer's end
  on, so the client's next request sees the debit).

One asyncio protocol and httptools, not a gRPC method: a unary gRPC call cost the processor
about 0.45 ms of CPU, several times the report's own work.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from inferway.gateway.envoy_http_lane import LaneConnection, LaneServer
from inferway.xds.translate.llm_local_admit import NOTICE_PATH
from inferway.xds.translate.llm_stream import ADMIT_PATH, FORWARDED_PREFIX, REPORT_PATH

__all__ = ["ReportLane"]

log = logging.getLogger(__name__)

_OK = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"
_FAILED = b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n"
_PATH = REPORT_PATH.encode()
_ADMIT = ADMIT_PATH.encode()
_NOTICE = NOTICE_PATH.encode()
_FORWARDED = FORWARDED_PREFIX.encode()

Take = Callable[[bytes], Awaitable[None]]
Admit = Callable[[Mapping[str, str], bytes], Awaitable[bytes]]
Notice = Callable[[Mapping[str, str]], None]


class _Connection(LaneConnection):
    """One Envoy connection: reports answered in the order they came."""

    lane: ReportLane

    def __init__(self, lane: ReportLane) -> None:
        super().__init__(lane)
        self.previous: asyncio.Future[None] | None = None
        """The last request's answer not yet written (answers keep the requests' order)."""
        self.forwarded: dict[str, str] = {}
        """The request's ``x-inferway-*`` headers (what the filter forwards to ``admit``)."""

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.forwarded = {}

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name.startswith(_FORWARDED):
            self.forwarded[name.decode("latin-1")] = value.decode("latin-1")

    def on_message_complete(self) -> None:
        self.lane.requests += 1
        keep_alive = self.parser.should_keep_alive()
        path = self.url.split(b"?", 1)[0]
        if path == _PATH:
            taken = asyncio.ensure_future(self.lane.take(b"".join(self.body)))
            self._answer(taken, _OK, keep_alive)
        elif path == _NOTICE and self.lane.notice is not None:
            try:
                self.lane.notice(self.forwarded)
            except Exception:  # the processor's bug: logged; Envoy does not wait for this
                self.lane.errors += 1
                log.exception("LLM reports: taking a notice failed")
            self._answer(None, _OK, keep_alive)
        elif path == _ADMIT and self.lane.admit is not None:
            admitted = asyncio.ensure_future(self.lane.admit(self.forwarded, b"".join(self.body)))
            self._answer(admitted, None, keep_alive)
        else:
            self._answer(None, _NOT_FOUND, keep_alive)

    def _answer(
        self,
        taken: asyncio.Future[Any] | None,
        answer: bytes | None,
        keep_alive: bool,
    ) -> None:
        """Writes ``answer`` (None: what ``taken`` returns) once ``taken`` and every earlier
        answer are done."""
        before = self.previous
        if taken is None and answer is not None and (before is None or before.done()):
            self._write(answer, keep_alive)
            return
        self.previous = asyncio.ensure_future(self._in_order(before, taken, answer, keep_alive))

    async def _in_order(
        self,
        before: asyncio.Future[None] | None,
        taken: asyncio.Future[Any] | None,
        answer: bytes | None,
        keep_alive: bool,
    ) -> None:
        if before is not None:
            await before  # never fails: failures are caught below
        try:
            result = await taken if taken is not None else None
        except Exception:  # the processor logs its own failures; Envoy gets an answer
            self.lane.errors += 1
            log.exception("LLM reports: taking a request failed")
            result = None
        if answer is None:  # an admission that failed: the filter fails the request closed
            answer = result if isinstance(result, bytes) else _FAILED
        self._write(answer, keep_alive)

    def _write(self, answer: bytes, keep_alive: bool) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.write(answer)
        if not keep_alive:
            transport.close()


class ReportLane(LaneServer):
    """The reports port on ``host:port``, handing each report's body to ``take`` and each
    request to admit to ``admit`` (None: the lane answers 404 there)."""

    def __init__(
        self,
        host: str,
        port: int,
        take: Take,
        admit: Admit | None = None,
        notice: Notice | None = None,
    ) -> None:
        super().__init__(
            host, port, "LLM processor's reports port", "llm.reports_port, default llm.port + 1"
        )
        self.take = take
        self.admit = admit
        self.notice = notice

    def connection(self) -> asyncio.Protocol:
        return _Connection(self)
