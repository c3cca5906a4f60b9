"""The LLM processor: what Envoy asks about each request of an ``openai`` route.

Two ways in, one logic (``llm.transport``): ``admit`` (``http``, the default: Envoy's Lua
filter posts the whole body to the reports port, report_lane.py, once), or the gRPC service
Envoy's external processor opens per request (``ext_proc``: the request's headers, then its
whole body). Either way the client's token limits are checked before a backend is asked,
the body's model picks the route, and aliases and ``include_usage`` are rewritten in.
Answers are not sent here: Envoy's Lua filter (xds/translate/llm_stream.py) reads them and
reports on the stream's id (``report``, on the reports port: report_lane.py): progress of a
stream (``ext_proc`` only), then the end of the answer, before its end is passed on, so the
client's next request sees the debit. The request is recorded once then, or when it ends
without a final report (the client went away): Envoy closes the ext_proc stream, or
(``http``) its access log names the request (``closed``, from what the Lua filter counted
into the request's metadata). Metrics, the budget's debit, a span. Answer messages Envoy
might still send (``response_headers``, ``response_body``, ``STREAMED``) are handled as
before.

Envoy is configured to fail closed for this processor (a request it cannot ask about fails,
500 over ext_proc, 503 from the Lua filter):
the limits it enforces must not be skipped by crashing it. A stream that errors here is
logged and counted; Envoy answers that client with an error.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import orjson
from opentelemetry import trace

from inferway._xds_protos.envoy.service.ext_proc.v3 import (
    external_processor_pb2 as ep_pb2,
)
from inferway._xds_protos.envoy.service.ext_proc.v3 import (
    external_processor_pb2_grpc as ep_grpc,
)
from inferway.gateway.ext_proc_passthrough import passthrough
from inferway.gateway.llm import admission_http
from inferway.gateway.llm.answers import (
    Refused,
    error_answer,
    let_go,
    pass_response_body,
    pass_response_headers,
    request_headers_continue,
    routed_body,
)
from inferway.gateway.llm.client_key import client_key
from inferway.gateway.llm.exchange import LlmSettings, LlmStream, counted_so_far
from inferway.gateway.llm.metrics import LlmMetrics, record_span
from inferway.gateway.llm.notice import LOCAL_ID_PREFIX, admitted_at, stream_of_notice
from inferway.gateway.llm.request import BadRequest, operation_of, prepare_request
from inferway.xds.translate.llm_stream import (
    FORWARDED_NO_BODY,
    FORWARDED_STARTED,
)

__all__ = ["LlmProcessor"]

log = logging.getLogger(__name__)
_tracer = trace.get_tracer("inferway.gateway.llm")
REPORT_GRACE_S = 1.0
"""How long an answer whose client went away waits for Envoy's in-flight progress reports."""
NOTICE_WAIT_S = 1.0
NOTICE_SKEW_S = 1.0
"""A stream Envoy admitted this much before the processor started (clocks apart by up to this
much) had its notice sent to a processor before this one: nothing is waited for."""
"""How long a report on a stream Envoy admitted itself waits for that stream's notice."""
OPEN_LIMIT_S = 6 * 3600.0
"""A stream still open after this long is recorded as it stands (its Envoy is gone)."""

_NO_BODY = Refused(400, "missing_body", "an OpenAI request has a JSON body")


def _headers(message: ep_pb2.HttpHeaders) -> dict[str, str]:
    out: dict[str, str] = {}
    for header in message.headers.headers:
        raw: bytes = header.raw_value
        out[header.key.lower()] = raw.decode("latin-1") if raw else str(header.value)
    return out


def _attribute(request: ep_pb2.ProcessingRequest, name: str) -> str | None:
    for attributes in request.attributes.values():
        value = attributes.fields.get(name)
        if value is not None and value.WhichOneof("kind") == "string_value":
            return str(value.string_value)
    return None


class LlmProcessor(ep_grpc.ExternalProcessorServicer):
    """``settings`` is read per request, so a policy edit applies to the next one."""

    def __init__(
        self,
        metrics: LlmMetrics,
        settings: LlmSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        tracer: trace.Tracer | None = None,
    ) -> None:
        """``tracer``: where the ``gen_ai`` spans go (default: the process's provider);
        ``wall``: the wall clock, compared with the times in Envoy's stream ids."""
        self.metrics = metrics
        self._tracer = tracer or _tracer
        self.settings = settings or LlmSettings()
        self._clock = clock
        self._started_wall = wall()
        self.requests = 0
        self.errors = 0
        self.refused = 0
        self.foreign = 0
        """Requests outside every openai prefix, let go at their headers."""
        self.reports = 0
        """Reports from Envoy's Lua filter (llm_stream.py), progress and final."""
        self.notices = 0
        """Requests Envoy's Lua filter admitted itself (``transport: http``, no limits)."""
        self.answer_messages = 0
        """ext_proc messages about answers (Envoy sends none: the Lua filter reads them)."""
        self._open: dict[str, tuple[LlmStream, LlmSettings]] = {}
        self._late: set[asyncio.Future[None]] = set()
        self._noticed: dict[str, asyncio.Future[None]] = {}
        """Reports waiting for the notice of a stream Envoy admitted itself."""
        self._ids = itertools.count(1)
        self._id_prefix = f"{os.getpid():x}-"

    async def Process(
        self, request_iterator: AsyncIterator[ep_pb2.ProcessingRequest], context: Any
    ) -> AsyncIterator[ep_pb2.ProcessingResponse]:
        stream: LlmStream | None = None
        settings = self.settings
        try:
            async for request in request_iterator:
                kind = request.WhichOneof("request")
                if kind == "request_headers":
                    stream, answer = await self._on_headers(request.request_headers, settings)
                    yield answer
                    if stream is None:
                        return
                elif kind == "request_body" and stream is not None:
                    yield self._on_body(stream, request.request_body.body, settings)
                    if stream.request is None:
                        return
                elif kind == "response_headers" and stream is not None:
                    self.answer_messages += 1
                    headers = _headers(request.response_headers)
                    stream.on_response_headers(
                        int(headers.get(":status", "0") or 0),
                        headers.get("content-type", ""),
                        _attribute(request, "xds.route_name"),
                        _attribute(request, "xds.cluster_name"),
                    )
                    if request.response_headers.end_of_stream:
                        await self._finish(stream, settings)
                    yield pass_response_headers()
                elif kind == "response_body" and stream is not None:
                    self.answer_messages += 1
                    body = request.response_body
                    replacement = stream.on_response_chunk(
                        body.body, body.end_of_stream, self._clock()
                    )
                    if body.end_of_stream:  # counted before the client has it all
                        await self._finish(stream, settings)
                    yield pass_response_body(replacement)
                else:
                    yield passthrough(kind)
        except Exception:
            self.errors += 1
            log.exception("LLM processor: a stream failed; Envoy answers its client with an error")
        finally:
            if stream is not None and stream.request is not None and not stream.finished:
                # the client or Envoy went away: Envoy's Lua filter may still have a progress
                # report on its way (it sends them without waiting), so record a moment later
                late = asyncio.ensure_future(self._finish_after(stream, settings))
                self._late.add(late)
                late.add_done_callback(self._late.discard)

    async def settle(self) -> None:
        """Record the answers still waiting for late reports (on stop)."""
        if self._late:
            await asyncio.gather(*self._late, return_exceptions=True)

    async def _finish_after(self, stream: LlmStream, settings: LlmSettings) -> None:
        try:
            await asyncio.sleep(REPORT_GRACE_S)
        finally:  # recorded even when the processor stops meanwhile
            await self._finish(stream, settings)

    async def _on_headers(
        self, message: ep_pb2.HttpHeaders, settings: LlmSettings
    ) -> tuple[LlmStream | None, ep_pb2.ProcessingResponse]:
        stream, refused = await self._check(_headers(message), settings)
        if refused is not None:
            return None, error_answer(refused)
        if stream is None:
            return None, let_go()
        if message.end_of_stream:
            return None, error_answer(_NO_BODY)
        return stream, request_headers_continue()

    def _on_body(
        self, stream: LlmStream, body: bytes, settings: LlmSettings
    ) -> ep_pb2.ProcessingResponse:
        refused = self._read_body(stream, body, settings)
        if refused is not None:
            return error_answer(refused)
        assert stream.request is not None
        return routed_body(stream.request.model, stream.request.body, stream.id, stream.drop_usage)

    async def admit(
        self, headers: Mapping[str, str], body: bytes | None
    ) -> tuple[LlmStream | None, Refused | None]:
        """The request lane (Envoy's Lua filter asks once, with the headers it forwards and
        the whole body; None for a request without one): the stream admitted, or the refusal
        the client gets, or neither (not this processor's request: let it go untouched)."""
        settings = self.settings
        if self._open:
            await self._sweep()
        stream, refused = await self._check(headers, settings)
        if stream is None or refused is not None:
            return None, refused
        if body is None:
            return None, _NO_BODY
        refused = self._read_body(stream, body, settings)
        return (None, refused) if refused is not None else (stream, None)

    async def admit_http(self, forwarded: Mapping[str, str], body: bytes) -> bytes:
        """The request lane over HTTP (report_lane.py): the headers Envoy's Lua filter
        forwards (llm_stream.py) in, the answer it acts on out (admission_http.py)."""
        headers = admission_http.forwarded_headers(forwarded, self.settings.client_header)
        no_body = FORWARDED_NO_BODY in forwarded
        stream, refusal = await self.admit(headers, None if no_body else body)
        if stream is not None:  # TTFT from the headers reaching Envoy's filter, not from here
            stream.started_at_wall(forwarded.get(FORWARDED_STARTED, ""))
        if refusal is not None:
            return admission_http.refused(refusal)
        return admission_http.let_go() if stream is None else admission_http.admitted(stream)

    async def _sweep(self) -> None:
        """Streams open longer than ``OPEN_LIMIT_S`` are recorded as they stand: no final report
        and no access log entry came (an Envoy that died; ``llm.transport: http``, where no
        ext_proc stream closes with it). Oldest first: ``_open`` keeps admission order."""
        limit = self._clock() - OPEN_LIMIT_S
        while self._open:
            stream, settings = next(iter(self._open.values()))
            if stream.started > limit:
                return
            await self._finish(stream, settings)

    async def _check(
        self, headers: Mapping[str, str], settings: LlmSettings
    ) -> tuple[LlmStream | None, Refused | None]:
        """The request's headers: whose it is and whether its token limits allow it."""
        if not _under(headers.get(":path", ""), settings.prefixes):
            self.foreign += 1
            return None, None
        self.requests += 1
        client = client_key(headers, settings.client_header, hashed=settings.hash_client)
        stream = LlmStream(client, operation_of(headers.get(":path", "")), self._clock())
        stream.wall_started = time.time()
        if settings.budget is not None:
            refusal = await settings.budget.check(client)
            if refusal is not None:
                self.refused += 1
                self.metrics.limited.labels(client, refusal.limit).inc()
                message_text = (
                    f"token limit {refusal.limit} ({refusal.tokens} tokens) used up by this "
                    f"client key ({refusal.used} used); retry after {refusal.retry_after_s}s"
                )
                return None, Refused(
                    429,
                    refusal.limit,
                    message_text,
                    retry_after_s=refusal.retry_after_s,
                    extra={"limit": refusal.limit, "limit_tokens": refusal.tokens},
                )
        return stream, None

    def _read_body(self, stream: LlmStream, body: bytes, settings: LlmSettings) -> Refused | None:
        """The whole body: its model, the rewrite; the stream is then open for reports."""
        try:
            prepared = prepare_request(body, settings.models, ask_for_usage=settings.ask_for_usage)
        except BadRequest as bad:
            return Refused(bad.status, bad.code, bad.message)
        stream.on_request(prepared, len(body), settings.routes.get(prepared.model, ""))
        # Envoy's Lua filter reads the answer and reports on this id
        stream.id = f"{self._id_prefix}{next(self._ids)}"
        self._open[stream.id] = stream, settings
        return None

    def notice(self, forwarded: Mapping[str, str]) -> None:
        """A request Envoy's Lua filter admitted itself (notice.py): its stream is registered
        for the reports that follow, as ``admit`` registers one."""
        stream = stream_of_notice(forwarded, self.settings, self._clock)
        self.requests += 1
        self.notices += 1
        if (
            self._open
            and next(iter(self._open.values()))[0].started < stream.started - OPEN_LIMIT_S
        ):
            sweep = asyncio.ensure_future(self._sweep())  # recorded on stop at the latest
            self._late.add(sweep)
            sweep.add_done_callback(self._late.discard)
        self._open[stream.id] = stream, self.settings
        waiting = self._noticed.pop(stream.id, None)
        if waiting is not None and not waiting.done():
            waiting.set_result(None)

    async def _entry(self, sid: str) -> tuple[LlmStream, LlmSettings] | None:
        """The open stream ``sid``; for one Envoy admitted itself, its notice may still be on
        its way (sent without waiting, on another connection): waited for a moment, unless
        Envoy admitted it before this processor started (the notice went to the one before)."""
        entry = self._open.get(sid)
        if entry is not None or not sid.startswith(LOCAL_ID_PREFIX):
            return entry
        admitted = admitted_at(sid)
        if admitted is not None and admitted < self._started_wall - NOTICE_SKEW_S:
            return None
        waiting = self._noticed.setdefault(sid, asyncio.get_running_loop().create_future())
        try:
            async with asyncio.timeout(NOTICE_WAIT_S):
                await asyncio.shield(waiting)
        except TimeoutError:
            return None
        finally:
            self._noticed.pop(sid, None)
        return self._open.get(sid)

    async def report(self, raw: bytes) -> None:
        """A report of Envoy's Lua filter on an answer (llm_stream.py, on the reports port:
        a JSON line, then a plain answer's bytes): progress of a stream, or the end of the
        answer (recorded before Envoy passes its last chunk on).
        Unknown ids (the stream already recorded, a processor restarted) are ignored."""
        self.reports += 1
        try:
            head, _, plain = raw.partition(b"\n")
            report = orjson.loads(head)
            entry = await self._entry(str(report.get("id")))
            if entry is not None:
                stream, settings = entry
                stream.on_envoy_report(report, plain)
                if report.get("final") is True:
                    await self._finish(stream, settings)
        except Exception:
            self.errors += 1
            log.exception("LLM processor: a report from Envoy's stream filter failed")

    async def closed(self, tags: Mapping[str, object]) -> None:
        """A request Envoy's access log says is over while still open here (``llm.transport:
        http``: the client went away before its answer's end): recorded from what the Lua
        filter counted into its ``inferway.llm`` metadata (its first token, then every 16)."""
        entry = await self._entry(str(tags.get("id")))
        if entry is None:
            return
        stream, settings = entry
        stream.on_envoy_report(counted_so_far(tags), b"")
        await self._finish(stream, settings)

    async def _finish(self, stream: LlmStream, settings: LlmSettings) -> None:
        """Record the request once; a failure here is logged, never the client's problem."""
        self._open.pop(stream.id, None)
        if stream.finished:
            return
        try:
            exchange, usage = stream.outcome()
            self.metrics.record(exchange)
            if settings.budget is not None:
                tokens = usage.input_tokens + usage.output_tokens
                await settings.budget.debit(stream.client, tokens)
            record_span(self._tracer, exchange, stream.started, self._clock())
        except Exception:
            self.errors += 1
            log.exception("LLM processor: recording a finished request failed")


def _under(path: str, prefixes: tuple[str, ...]) -> bool:
    """``path`` (query and all) lies under one of ``prefixes`` (``/v1`` holds ``/v1/models``
    and ``/v1?x``, not ``/v1beta``)."""
    return any(p == "/" or path == p or path.startswith((p + "/", p + "?")) for p in prefixes)
