"""The LLM processor's reports port: Envoy's Lua filter (xds/translate/llm_stream.py) posts
a report on each answer here, plain HTTP/1.1 over Envoy's keep-alive connections
(``POST /inferway/llm/report``: a JSON line, then a plain answer's bytes). Each gets an empty
200 once the processor has taken it: for a final report, once the request is recorded (the
Lua filter waits for that before it passes the answer's end on, so the client's next request
sees the debit).

One asyncio protocol and httptools, not a gRPC method: a unary gRPC call cost the processor
about 0.45 ms of CPU, several times the report's own work.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from inferway.gateway.envoy_http_lane import LaneConnection, LaneServer
from inferway.xds.translate.llm_stream import REPORT_PATH

__all__ = ["ReportLane"]

log = logging.getLogger(__name__)

_OK = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"
_PATH = REPORT_PATH.encode()

Take = Callable[[bytes], Awaitable[None]]


class _Connection(LaneConnection):
    """One Envoy connection: reports answered in the order they came."""

    lane: ReportLane

    def __init__(self, lane: ReportLane) -> None:
        super().__init__(lane)
        self.previous: asyncio.Future[None] | None = None
        """The last report's answer not yet written (answers keep the requests' order)."""

    def on_message_complete(self) -> None:
        self.lane.requests += 1
        keep_alive = self.parser.should_keep_alive()
        if self.url.split(b"?", 1)[0] != _PATH:
            self._answer(None, _NOT_FOUND, keep_alive)
            return
        taken = asyncio.ensure_future(self.lane.take(b"".join(self.body)))
        self._answer(taken, _OK, keep_alive)

    def _answer(self, taken: asyncio.Future[None] | None, answer: bytes, keep_alive: bool) -> None:
        """Writes ``answer`` once ``taken`` and every earlier answer are done."""
        before = self.previous
        if taken is None and (before is None or before.done()):
            self._write(answer, keep_alive)
            return
        self.previous = asyncio.ensure_future(self._in_order(before, taken, answer, keep_alive))

    async def _in_order(
        self,
        before: asyncio.Future[None] | None,
        taken: asyncio.Future[None] | None,
        answer: bytes,
        keep_alive: bool,
    ) -> None:
        for step in (before, taken):
            if step is not None:
                try:
                    await step
                except Exception:  # the processor logs its own failures; Envoy gets its 200
                    self.lane.errors += 1
                    log.exception("LLM reports: taking a report failed")
        self._write(answer, keep_alive)

    def _write(self, answer: bytes, keep_alive: bool) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.write(answer)
        if not keep_alive:
            transport.close()


class ReportLane(LaneServer):
    """The reports port on ``host:port``, handing each report's body to ``take``."""

    def __init__(self, host: str, port: int, take: Take) -> None:
        super().__init__(
            host, port, "LLM processor's reports port", "llm.reports_port, default llm.port + 1"
        )
        self.take = take

    def connection(self) -> asyncio.Protocol:
        return _Connection(self)
