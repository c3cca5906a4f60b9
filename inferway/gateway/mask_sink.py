"""The mask sink: where Envoy's access log lines and spans go first when the policy has a
``mask``, so nothing Envoy logs or traces leaves in clear (Envoy cannot rewrite a value by
pattern itself).

* **Access logs** arrive as OTLP log records (``LogsService.Export``) whose body holds the
  line's keys and values (xds/translate/mask_sink.py); the sink masks every value and writes
  the JSON line to the policy's ``access_log.path`` (stdout, stderr or a file).
* **Spans** arrive as OTLP traces (``TraceService.Export``); the sink masks span names,
  attribute values, event and status texts, then forwards them to the policy's collector.

It follows the live policy (started, moved, reconfigured or stopped by edits). While it is
down Envoy cannot deliver, so those lines and spans are lost rather than written in clear.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from dataclasses import dataclass
from typing import IO, Any

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2

from inferway.gateway.control_plane import AppliedPolicy, ControlPlane, PolicyFollower
from inferway.observability.masking import NO_MASKING, Masker, build_masker_from
from inferway.policies.masking import Mask
from inferway.policies.model import Policy

__all__ = [
    "MaskSink",
    "MaskSinkKeeper",
    "SinkConfig",
    "build_masker",
    "build_sink_config",
]

log = logging.getLogger(__name__)

_NUMBERS = {"response_code", "duration_ms", "bytes_received", "bytes_sent"}
"""Keys Envoy's JSON format writes as numbers; the OTLP body carries every value as text."""


def build_masker(mask: Mask | None) -> Masker:
    if mask is None:
        return NO_MASKING
    rules = [*dict.fromkeys(mask.builtins), *mask.patterns]
    return build_masker_from(rules, mask.fields, mask.replacement)


@dataclass(frozen=True)
class SinkConfig:
    masker: Masker
    log_path: str | None
    """``stdout``, ``stderr``, an absolute path, or None (access logs off)."""
    collector: tuple[str, int] | None
    """The real OTLP collector spans are forwarded to (None: tracing off)."""
    collector_timeout: float = 1.0


def build_sink_config(policy: Policy) -> SinkConfig:
    observability = policy.observability
    access_log = None if observability is None else observability.access_log
    tracing = None if observability is None else observability.tracing
    return SinkConfig(
        masker=build_masker(policy.mask),
        log_path=access_log.path if access_log is not None and access_log.enabled else None,
        collector=None if tracing is None else tracing.collector_host_port,
        collector_timeout=1.0 if tracing is None else tracing.timeout,
    )


def _plain(value: common_pb2.AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "kvlist_value":
        return {kv.key: _plain(kv.value) for kv in value.kvlist_value.values}
    if kind == "array_value":
        return [_plain(v) for v in value.array_value.values]
    return None if kind is None else getattr(value, kind)


def _mask_value(value: common_pb2.AnyValue, masker: Masker) -> None:
    kind = value.WhichOneof("value")
    if kind == "string_value":
        value.string_value = masker.text(value.string_value)
    elif kind == "array_value":
        for item in value.array_value.values:
            _mask_value(item, masker)
    elif kind == "kvlist_value":
        for kv in value.kvlist_value.values:
            _mask_value(kv.value, masker)


def _mask_attributes(attributes: Any, masker: Masker) -> None:
    for kv in attributes:
        _mask_value(kv.value, masker)


def line_of(body: common_pb2.AnyValue, masker: Masker) -> str:
    """The JSON access log line of one record's body, masked."""
    fields = _plain(body)
    if not isinstance(fields, dict):
        fields = {"message": fields}
    for key in _NUMBERS & fields.keys():
        if isinstance(fields[key], str) and fields[key].isascii() and fields[key].isdigit():
            fields[key] = int(fields[key])
    return json.dumps(masker.value(fields), sort_keys=True, separators=(",", ":"))


class _LineWriter:
    def __init__(self) -> None:
        self.path: str | None = None
        self._file: IO[str] | None = None

    def write(self, path: str, line: str) -> None:
        if path == "stdout":
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
            return
        if path == "stderr":
            sys.stderr.write(line + "\n")
            return
        if self.path != path or self._file is None:
            self.close()
            self._file, self.path = open(path, "a", encoding="utf-8"), path  # noqa: SIM115
        self._file.write(line + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file, self.path = None, None


class _Logs(logs_service_pb2_grpc.LogsServiceServicer):
    def __init__(self, sink: MaskSink) -> None:
        self.sink = sink

    async def Export(
        self, request: logs_service_pb2.ExportLogsServiceRequest, context: Any
    ) -> logs_service_pb2.ExportLogsServiceResponse:
        config = self.sink.config
        if config.log_path is not None:
            for resource in request.resource_logs:
                for scope in resource.scope_logs:
                    for record in scope.log_records:
                        self.sink.writer.write(config.log_path, line_of(record.body, config.masker))
                        self.sink.lines += 1
        return logs_service_pb2.ExportLogsServiceResponse()


class _Traces(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, sink: MaskSink) -> None:
        self.sink = sink

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        config = self.sink.config
        masker = config.masker
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                for span in scope.spans:
                    span.name = masker.text(span.name)
                    _mask_attributes(span.attributes, masker)
                    span.status.message = masker.text(span.status.message)
                    for event in span.events:
                        event.name = masker.text(event.name)
                        _mask_attributes(event.attributes, masker)
                    for link in span.links:
                        _mask_attributes(link.attributes, masker)
                    self.sink.spans += 1
        await self.sink.forward(request)
        return trace_service_pb2.ExportTraceServiceResponse()


class MaskSink:
    """One gRPC server (OTLP logs + traces) on ``host:port`` (0: the OS picks)."""

    def __init__(self, host: str, port: int, config: SinkConfig) -> None:
        self.host, self.port, self.config = host, port, config
        self.writer = _LineWriter()
        self.lines = self.spans = 0
        self._server: grpc.aio.Server | None = None
        self._channel: grpc.aio.Channel | None = None
        self._channel_target: tuple[str, int] | None = None

    async def start(self) -> MaskSink:
        server = grpc.aio.server()
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(_Logs(self), server)
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Traces(self), server)
        address = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        bound = server.add_insecure_port(address)
        if not bound:
            raise OSError(f"mask sink: cannot listen on {address}")
        await server.start()
        self.port, self._server = bound, server
        log.info("mask sink on %s:%d", self.host, self.port)
        return self

    async def forward(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        target = self.config.collector
        if target is None:
            return
        if self._channel is None or self._channel_target != target:
            if self._channel is not None:
                await self._channel.close()
            self._channel = grpc.aio.insecure_channel(f"{target[0]}:{target[1]}")
            self._channel_target = target
        stub = trace_service_pb2_grpc.TraceServiceStub(self._channel)
        try:
            await stub.Export(request, timeout=self.config.collector_timeout)
        except grpc.aio.AioRpcError as error:  # the collector's problem; Envoy need not retry
            log.warning("mask sink: the collector refused spans: %s", error.code().name)

    async def stop(self, grace: float = 0.2) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(grace)
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
        self.writer.close()


def _wanted(policy: Policy) -> tuple[str, int] | None:
    """Only when the policy masks and Envoy logs or traces at all."""
    observability = policy.observability
    if policy.mask is None or observability is None:
        return None
    logging_on = observability.access_log is not None and observability.access_log.enabled
    if not logging_on and observability.tracing is None:
        return None
    return policy.mask.sink.address, policy.mask.sink.port


class MaskSinkKeeper(PolicyFollower):
    """Runs the sink while the live policy needs it, reconfigured by every edit."""

    def __init__(self, plane: ControlPlane, policy: Policy) -> None:
        """Follows ``plane`` from ``policy`` (its live one) on, once started."""
        self._plane = plane
        self._initial = policy
        self.sink: MaskSink | None = None
        self._pending: asyncio.Task[None] | None = None

    async def follow(self, policy: Policy) -> None:
        wanted = _wanted(policy)
        config = build_sink_config(policy)
        current = None if self.sink is None else (self.sink.host, self.sink.port)
        if wanted == current and self.sink is not None:
            self.sink.config = config
            return
        if self.sink is not None:
            await self.sink.stop()
            self.sink = None
        if wanted is not None:
            self.sink = await MaskSink(*wanted, config).start()

    async def start(self) -> None:
        """Serve what the live policy asks for, then follow the control plane's applies."""
        await self.follow(self._initial)
        self._plane.add_observer(self)

    def on_applied(self, applied: AppliedPolicy, changed: bool) -> None:
        self._pending = asyncio.get_running_loop().create_task(self._follow(applied.policy))

    async def _follow(self, policy: Policy) -> None:
        try:
            await self.follow(policy)
        except OSError as error:  # Envoy cannot deliver: lines and spans are dropped, not leaked
            log.error("%s; access log lines and spans are dropped until it listens", error)

    async def stop(self) -> None:
        if self._pending is not None:
            await self._pending
        if self.sink is not None:
            await self.sink.stop()
            self.sink = None
