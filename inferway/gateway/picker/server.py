"""inferway's endpoint picker as an Envoy external processor, answering as the Gateway API
Inference Extension's Endpoint Picker protocol says (docs/picker.md), plus the gRPC health
service (``liveness``, ``readiness``, the ext_proc service name and ``""``).

Per request Envoy opens one stream, sends the headers, then the whole body (``BUFFERED``).
The answer to the body (or to the headers of a request without one) names the replica:

* ``x-gateway-destination-endpoint: ip:port,ip:port…`` (winner, then ordered fallbacks) set on
  the request, and the same value under ``envoy.lb`` in the dynamic metadata;
* or an immediate 503 (no endpoint; none in Envoy's ``envoy.lb.subset_hint`` subset) or 429
  (every replica saturated and the policy sheds).

The request is in flight (for the queue scorer) from the pick until Envoy closes the stream,
which it does when the HTTP request ends: answered, reset or timed out. The same server takes
Envoy's gRPC access log (``AccessLogService``) for ``transport: http`` picks (http_lane.py):
each entry's ticket header ends its pick. Each pick is traced as
a ``picker.pick`` span whose attributes say the scores per endpoint, the winner and why.

Why the stream is served the way it is: at 500 req/s the picker's CPU per request, not the pick,
decides the added latency, and most of it is grpc.aio's own per-message work. So the
ExternalProcessor service is a generic handler on raw bytes (``context.read()``/``write()``, no
async generator, no servicer stub), the empty answer to the headers is serialized once, a pick's
answer is serialized once per distinct endpoint list (there are few: winner and fallbacks of
one pool), and a pick is explained (scores per endpoint, the reason) only for a span that
records and when ``status`` asks for the last one (bench/picker_overhead.py measures it).
"""

from __future__ import annotations

import functools
import json
import logging
import secrets
from collections import deque
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import grpc
import orjson
from google.protobuf import json_format, struct_pb2
from opentelemetry import trace

from inferway._xds_protos.envoy.config.core.v3 import base_pb2
from inferway._xds_protos.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from inferway._xds_protos.envoy.service.accesslog.v3 import als_pb2
from inferway._xds_protos.envoy.service.ext_proc.v3 import (
    external_processor_pb2 as ep_pb2,
)
from inferway._xds_protos.envoy.type.v3 import http_status_pb2
from inferway.backends.telemetry.tracing import is_tracing
from inferway.gateway.ext_proc_passthrough import passthrough, streamed_body
from inferway.gateway.grpc_listen import listen_and_start
from inferway.gateway.picker.core.picker import Pick, Picker
from inferway.gateway.picker.core.prefix import prompt_text
from inferway.gateway.picker.health import add_health_service
from inferway.xds.translate.picker import (
    DESTINATION_HEADER,
    LB_NAMESPACE,
    SERVICE_METADATA_KEY,
    TICKET_HEADER,
)

__all__ = [
    "SUBSET_KEY",
    "SUBSET_NAMESPACE",
    "PickerServer",
    "PoolPicker",
    "explained",
    "finish_ticket",
    "pick_for",
]

log = logging.getLogger(__name__)
tracer = trace.get_tracer("inferway.picker")

EXPLAINED_CANDIDATES = 8
"""A span carries the scores of the 8 best candidates (and how many there were), not all."""
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
ACCESS_LOG_SERVICE = "envoy.service.accesslog.v3.AccessLogService"
_FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
MAX_HELD_BODY_BYTES = 1 << 20
"""A streamed body is held for the pick up to this much (as Envoy's buffer holds a
``BUFFERED`` one); past it the pick is by load only and the body passes on as it comes."""
_HEADERS_OK = ep_pb2.ProcessingResponse(
    request_headers=ep_pb2.HeadersResponse()
).SerializeToString()
"""The answer to a request's headers when its body follows: nothing to change yet."""


@dataclass
class PoolPicker:
    """One service's picker and what a request needs from it."""

    picker: Picker
    session_header: str = "x-session-id"
    recent: deque[Pick] = field(default_factory=lambda: deque(maxlen=64))
    """The last picks (``status`` explains the latest)."""
    nonce: str = field(default_factory=lambda: secrets.token_hex(6))
    """In each ``transport: http`` ticket header: an access log entry ends a pick only when
    it names this picker (not a client's forged header, not a replaced picker's ticket)."""

    def ticket(self, service: str, pick: Pick) -> bytes:
        """The ticket header's value for ``pick``: ``service.nonce.ticket``."""
        return f"{service}.{self.nonce}.{pick.ticket}".encode()

    def last_explained(self) -> dict[str, Any] | None:
        """The latest pick's explanation (span attributes), None before the first pick."""
        return explained(self.recent[-1]) if self.recent else None


def explained(pick: Pick) -> dict[str, Any]:
    """A pick's span attributes: the winner, the reason and the best candidates' scores."""
    attributes = pick.explain(top=EXPLAINED_CANDIDATES)
    attributes["picker.scores"] = json.dumps(attributes["picker.scores"])
    return attributes


def _header(headers: ep_pb2.HttpHeaders, name: str) -> str | None:
    for header in headers.headers.headers:
        if header.key == name:
            raw: bytes = header.raw_value
            return raw.decode("latin-1") if raw else str(header.value)
    return None


def _subset(request: ep_pb2.ProcessingRequest) -> list[str] | None:
    hint = request.metadata_context.filter_metadata.get(SUBSET_NAMESPACE)
    if hint is None or SUBSET_KEY not in hint.fields:
        return None
    value = json_format.MessageToDict(hint)[SUBSET_KEY]
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _answer(pick: Pick, phase: str) -> ep_pb2.ProcessingResponse:
    if pick.status != 200:
        body = json.dumps({"error": pick.reason, "status": pick.status}).encode()
        return ep_pb2.ProcessingResponse(
            immediate_response=ep_pb2.ImmediateResponse(
                status=http_status_pb2.HttpStatus(code=pick.status),  # type: ignore[arg-type]
                headers=ep_pb2.HeaderMutation(
                    set_headers=[
                        base_pb2.HeaderValueOption(
                            header=base_pb2.HeaderValue(
                                key="content-type", raw_value=b"application/json"
                            )
                        )
                    ]
                ),
                body=body,
                details=f"endpoint_picker_{pick.status}",
            )
        )
    value = ",".join(pick.endpoints)
    common = ep_pb2.CommonResponse(
        header_mutation=ep_pb2.HeaderMutation(
            set_headers=[
                base_pb2.HeaderValueOption(
                    header=base_pb2.HeaderValue(key=DESTINATION_HEADER, raw_value=value.encode()),
                    append_action=base_pb2.HeaderValueOption.HeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD,
                )
            ]
        )
    )
    metadata = struct_pb2.Struct()
    metadata.update({LB_NAMESPACE: {DESTINATION_HEADER: value}})
    if phase == "headers":
        return ep_pb2.ProcessingResponse(
            request_headers=ep_pb2.HeadersResponse(response=common), dynamic_metadata=metadata
        )
    return ep_pb2.ProcessingResponse(
        request_body=ep_pb2.BodyResponse(response=common), dynamic_metadata=metadata
    )


@functools.lru_cache(maxsize=4096)
def _answer_bytes(endpoints: tuple[str, ...], phase: str) -> bytes:
    """A 200 pick's serialized answer: it depends only on the endpoints listed and the phase."""
    return _answer(Pick(200, endpoints, ""), phase).SerializeToString()


def _serialized(pick: Pick, phase: str) -> bytes:
    if pick.status == 200:
        return _answer_bytes(pick.endpoints, phase)
    return _answer(pick, phase).SerializeToString()


def _parse(body: bytes) -> tuple[str | None, str | None]:
    """The prompt's text and the requested model (a LoRA adapter is asked for by name).
    orjson reads a body in a third of the standard library's time; what it refuses (NaN,
    integers past 64 bits, lone surrogates) the standard library still reads."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        try:
            data = json.loads(body)
        except ValueError:
            return None, None
    model = data.get("model") if isinstance(data, dict) else None
    return prompt_text(data), (model if isinstance(model, str) else None)


def pick_for(
    pool: PoolPicker | None, text: str | None, model: str | None, session: str | None,
    subset: list[str] | None,
) -> Pick:  # fmt: skip
    """One pick, traced as a ``picker.pick`` span (explained only when the span records;
    no span at all without a tracing SDK, as most picks are never traced)."""
    if pool is None:
        return Pick(503, (), "no picker for this service here")
    picker = pool.picker
    traced = tracer.start_as_current_span("picker.pick") if is_tracing(tracer) else nullcontext()
    with traced as span:
        pick = picker.pick(picker.blocks(text), lora=model, session=session, subset=subset)
        if span is not None and span.is_recording():
            span.set_attributes(explained(pick))
    pool.recent.append(pick)
    return pick


def finish_ticket(pools: dict[str, PoolPicker], value: str) -> bool:
    """Ends the pick a ticket header names (``PoolPicker.ticket``); False when it names no
    live pick of these pools (forged, malformed, or its picker was replaced)."""
    service, _, rest = value.rpartition(".")
    service, _, nonce = service.rpartition(".")
    pool = pools.get(service)
    if pool is None or pool.nonce != nonce or not rest.isdigit():
        return False
    pool.picker.finish(int(rest))
    return True


class _Processor:
    def __init__(self, pools: Callable[[], dict[str, PoolPicker]]) -> None:
        self._pools = pools
        self.requests = 0
        self.errors = 0

    def _pool(self, context: Any) -> PoolPicker | None:
        pools = self._pools()
        name = dict(context.invocation_metadata() or ()).get(SERVICE_METADATA_KEY)
        if name is None and len(pools) == 1:  # a GAIE-style gateway: it names no service
            return next(iter(pools.values()))
        return pools.get(name) if isinstance(name, str) else None

    async def process(self, _requests: object, context: Any) -> None:
        """One Envoy stream (one HTTP request): headers, then the body when there is one.
        A ``BUFFERED`` body comes whole after the headers' answer. A ``FULL_DUPLEX_STREAMED``
        one (inferway's own Envoys ask so; a GAIE gateway may) comes in chunks without
        waiting: the headers are answered with the pick once the body has ended (or once
        more than ``MAX_HELD_BODY_BYTES`` came: then by load only), and the body is sent
        back on, as that mode requires."""
        pool = self._pool(context)
        pick: Pick | None = None
        session: str | None = None
        subset: list[str] | None = None
        duplex = False
        held: bytearray | None = None
        """Full duplex: the body so far, until the pick."""
        try:
            while (raw := await context.read()) is not grpc.aio.EOF:
                request = ep_pb2.ProcessingRequest.FromString(raw)
                kind = request.WhichOneof("request")
                if kind == "request_headers":
                    self.requests += 1
                    headers = request.request_headers
                    subset = _subset(request)
                    if pool is not None:
                        session = _header(headers, pool.session_header)
                    duplex = request.protocol_config.request_body_mode == _FULL_DUPLEX
                    if headers.end_of_stream:
                        pick = pick_for(pool, None, None, session, subset)
                        await context.write(_serialized(pick, "headers"))
                    elif duplex:
                        held = bytearray()  # the headers' answer waits for the body
                    else:
                        await context.write(_HEADERS_OK)
                elif kind in ("request_body", "request_trailers") and held is not None:
                    chunk = request.request_body
                    held += chunk.body
                    ended = chunk.end_of_stream or kind == "request_trailers"
                    if not ended and len(held) <= MAX_HELD_BODY_BYTES:
                        continue
                    text, model = _parse(bytes(held)) if ended else (None, None)
                    pick = pick_for(pool, text, model, session, subset)
                    await context.write(_serialized(pick, "headers"))
                    if pick.status != 200:
                        return  # answered with an error: the request goes no further
                    await context.write(
                        streamed_body(bytes(held), chunk.end_of_stream).SerializeToString()
                    )
                    held = None
                    if kind == "request_trailers":
                        await context.write(passthrough(kind).SerializeToString())
                elif kind == "request_body" and duplex:  # picked already: pass the rest on
                    chunk = request.request_body
                    await context.write(
                        streamed_body(chunk.body, chunk.end_of_stream).SerializeToString()
                    )
                elif kind == "request_body":
                    text, model = _parse(request.request_body.body)
                    pick = pick_for(pool, text, model, session, subset)
                    await context.write(_serialized(pick, "body"))
                else:  # not asked for by inferway's processing mode: pass it through
                    await context.write(passthrough(kind).SerializeToString())
        except Exception:
            self.errors += 1
            log.exception("picker: a stream failed; Envoy applies the service's fail mode")
        finally:  # the request is over (Envoy closes the stream with it): no longer in flight
            if pick is not None and pool is not None:
                pool.picker.finish(pick.ticket)


class PickerServer:
    """One gRPC server on ``host:port`` (port 0: the OS picks; ``port`` tells) serving the
    pools in ``pools`` (service name -> its picker; edits replace entries in place)."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.pools: dict[str, PoolPicker] = {}
        self.processor = _Processor(lambda: self.pools)
        self.finished = 0
        """Picks of ``transport: http`` ended by Envoy's access log entries."""
        self._server: grpc.aio.Server | None = None

    async def stream_access_logs(self, requests: Any, _context: Any) -> bytes:
        """Envoy's gRPC access log (``transport: http``): each entry that carries a ticket
        header is a request over (answered, reset or timed out): its pick ends."""
        async for raw in requests:
            message = als_pb2.StreamAccessLogsMessage.FromString(raw)
            for entry in message.http_logs.log_entry:
                value = entry.request.request_headers.get(TICKET_HEADER)
                if value is not None and finish_ticket(self.pools, value):
                    self.finished += 1
        return b""  # StreamAccessLogsResponse: empty

    async def start(self) -> PickerServer:
        server = grpc.aio.server()
        handler = grpc.stream_stream_rpc_method_handler(self.processor.process)  # raw bytes
        logs = grpc.stream_unary_rpc_method_handler(self.stream_access_logs)
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(SERVICE, {"Process": handler}),
                grpc.method_handlers_generic_handler(
                    ACCESS_LOG_SERVICE, {"StreamAccessLogs": logs}
                ),
            )
        )
        add_health_service(server, ready=lambda: bool(self.pools))
        self.port = await listen_and_start(server, self.host, self.port, "endpoint picker")
        self._server = server
        return self

    async def stop(self, grace: float = 0.2) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(grace)
