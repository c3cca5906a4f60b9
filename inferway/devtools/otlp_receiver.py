"""A small in-process OTLP/gRPC trace receiver: what tests and ``inferway demo`` point Envoy and
the backends at, so a trace can be checked (or shown) without running a collector.

It implements the OpenTelemetry protocol's ``TraceService.Export`` and keeps every span it is
sent, flattened to :class:`ReceivedSpan` (hex ids, plain attribute values, the exporting
service's name). Loopback only, bounded: past ``max_spans`` the oldest spans are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

__all__ = ["OtlpReceiver", "ReceivedSpan", "flatten_export_request", "start_otlp_receiver"]

_KINDS = {
    trace_pb2.Span.SPAN_KIND_INTERNAL: "internal",
    trace_pb2.Span.SPAN_KIND_SERVER: "server",
    trace_pb2.Span.SPAN_KIND_CLIENT: "client",
    trace_pb2.Span.SPAN_KIND_PRODUCER: "producer",
    trace_pb2.Span.SPAN_KIND_CONSUMER: "consumer",
}


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as received; ids are lowercase hex, ``parent_span_id`` is "" for a root."""

    service: str
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    links: tuple[tuple[str, str], ...] = ()
    """(trace_id, span_id) of every span this one links to."""
    status_error: bool = False

    @property
    def duration_s(self) -> float:
        return max(self.end_ns - self.start_ns, 0) / 1e9


def _value(value: common_pb2.AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind)


def _attributes(pairs: Iterable[common_pb2.KeyValue]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


def flatten_export_request(
    request: trace_service_pb2.ExportTraceServiceRequest,
) -> list[ReceivedSpan]:
    """Every span of an OTLP export request, with its resource's ``service.name``."""
    spans: list[ReceivedSpan] = []
    for resource_spans in request.resource_spans:
        service = str(_attributes(resource_spans.resource.attributes).get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        service=service,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        name=span.name,
                        kind=_KINDS.get(span.kind, "unspecified"),
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes=_attributes(span.attributes),
                        links=tuple((ln.trace_id.hex(), ln.span_id.hex()) for ln in span.links),
                        status_error=span.status.code == trace_pb2.Status.STATUS_CODE_ERROR,
                    )
                )
    return spans


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self._receiver.add(flatten_export_request(request))
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    """Holds received spans; ``endpoint`` is the ``host:port`` to give exporters."""

    def __init__(self, max_spans: int = 100_000) -> None:
        self._spans: deque[ReceivedSpan] = deque(maxlen=max_spans)
        self._changed = asyncio.Event()
        self._server: grpc.aio.Server | None = None
        self.host = "127.0.0.1"
        self.port = 0
        self.exports = 0

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def add(self, spans: list[ReceivedSpan]) -> None:
        self._spans.extend(spans)
        self.exports += 1
        self._changed.set()

    def spans(self, predicate: Callable[[ReceivedSpan], bool] | None = None) -> list[ReceivedSpan]:
        return [s for s in self._spans if predicate is None or predicate(s)]

    def clear(self) -> None:
        self._spans.clear()

    async def wait_for(
        self,
        predicate: Callable[[list[ReceivedSpan]], bool],
        timeout: float,
    ) -> list[ReceivedSpan]:
        """Wait until ``predicate(all spans)`` holds; returns the spans, or raises
        TimeoutError naming what arrived."""
        deadline = time.monotonic() + timeout
        while True:
            spans = list(self._spans)
            if predicate(spans):
                return spans
            left = deadline - time.monotonic()
            if left <= 0:
                names = sorted({f"{s.service}:{s.name}" for s in spans})
                raise TimeoutError(
                    f"OTLP receiver on {self.endpoint}: condition not met within {timeout:.1f}s; "
                    f"received {len(spans)} spans ({', '.join(names) or 'none'})"
                )
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(left, 0.25)):
                    await self._changed.wait()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> OtlpReceiver:
        server = grpc.aio.server()
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self), server)
        bound = server.add_insecure_port(f"{host}:{port}")
        if bound == 0:
            raise OSError(f"OTLP receiver could not bind {host}:{port}")
        await server.start()
        self._server, self.host, self.port = server, host, bound
        return self

    async def stop(self, grace: float = 0.5) -> None:
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None

    async def __aenter__(self) -> OtlpReceiver:
        if self._server is None:
            await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


async def start_otlp_receiver(host: str = "127.0.0.1", port: int = 0) -> OtlpReceiver:
    """A started receiver on ``host:port`` (a free port when 0)."""
    return await OtlpReceiver().start(host, port)
