"""The picker's gRPC side on loopback, without Envoy: the Endpoint Picker protocol's answers
(header + ``envoy.lb`` metadata with ordered fallbacks, 503, 429, the subset hint), the
in-flight count released when the stream ends, and the gRPC health service."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import grpc
import pytest
from google.protobuf import json_format, struct_pb2
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from inferway._xds_protos.envoy.config.core.v3 import base_pb2
from inferway._xds_protos.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from inferway._xds_protos.envoy.service.ext_proc.v3 import (
    external_processor_pb2 as ep_pb2,
)
from inferway._xds_protos.envoy.service.ext_proc.v3 import (
    external_processor_pb2_grpc as ep_grpc,
)
from inferway.gateway.picker import server as server_module
from inferway.gateway.picker.core.metrics import ServerMetrics
from inferway.gateway.picker.core.picker import Picker, PickerConfig
from inferway.gateway.picker.health import HEALTH_METHOD, decode_service
from inferway.gateway.picker.server import PickerServer, PoolPicker

pytestmark = pytest.mark.asyncio
ENDPOINTS = ["127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003"]


@pytest.fixture
async def server() -> AsyncIterator[PickerServer]:
    running = await PickerServer("127.0.0.1", 0).start()
    picker = Picker(PickerConfig(fallbacks=2, queue_limit=1, shed=True))
    picker.set_endpoints(ENDPOINTS)
    running.pools["llm"] = PoolPicker(picker)
    try:
        yield running
    finally:
        await running.stop()


def _headers(eos: bool, subset: list[str] | None = None) -> ep_pb2.ProcessingRequest:
    request = ep_pb2.ProcessingRequest(
        request_headers=ep_pb2.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[base_pb2.HeaderValue(key=":path", raw_value=b"/v1/chat/completions")]
            ),
            end_of_stream=eos,
        )
    )
    if subset is not None:
        hint = struct_pb2.Struct()
        hint.update({"x-gateway-destination-endpoint-subset": subset})
        request.metadata_context.filter_metadata["envoy.lb.subset_hint"].CopyFrom(hint)
    return request


def _body(prompt: str) -> ep_pb2.ProcessingRequest:
    body = json.dumps({"model": "m", "prompt": prompt}).encode()
    return ep_pb2.ProcessingRequest(request_body=ep_pb2.HttpBody(body=body, end_of_stream=True))


async def _exchange(
    server: PickerServer, requests: list[ep_pb2.ProcessingRequest]
) -> list[ep_pb2.ProcessingResponse]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = ep_grpc.ExternalProcessorStub(channel)
        call = stub.Process(iter(requests), metadata=(("x-inferway-picker-service", "llm"),))
        return [response async for response in call]


def _destination(response: ep_pb2.ProcessingResponse) -> tuple[str, str]:
    common = response.request_body.response
    (header,) = common.header_mutation.set_headers
    metadata = json_format.MessageToDict(response.dynamic_metadata)
    return header.header.raw_value.decode(), metadata["envoy.lb"]["x-gateway-destination-endpoint"]


async def test_a_pick_names_the_winner_then_fallbacks_in_header_and_metadata(
    server: PickerServer,
) -> None:
    responses = await _exchange(server, [_headers(eos=False), _body("p" * 640)])
    assert responses[0].WhichOneof("response") == "request_headers"
    header, metadata = _destination(responses[1])
    assert header == metadata and sorted(header.split(",")) == sorted(ENDPOINTS)
    stats = server.pools["llm"].picker.stats()
    assert all(s["in_flight"] == 0 for s in stats.values())  # the stream ended: released
    assert (server.pools["llm"].last_explained() or {}).get("picker.winner") == header.split(",")[0]


async def test_subset_hint_no_endpoint_503_and_shedding_429(server: PickerServer) -> None:
    responses = await _exchange(server, [_headers(eos=False, subset=[ENDPOINTS[1]]), _body("x")])
    assert _destination(responses[1])[0] == ENDPOINTS[1]
    (none,) = await _exchange(server, [_headers(eos=True, subset=["10.9.9.9:1"])])
    assert none.immediate_response.status.code == 503
    for endpoint in ENDPOINTS:
        server.pools["llm"].picker.observe(endpoint, ServerMetrics(waiting=3))
    (shed,) = await _exchange(server, [_headers(eos=True)])
    assert shed.immediate_response.status.code == 429
    assert "saturated" in json.loads(shed.immediate_response.body)["error"]


async def test_a_recorded_span_explains_the_pick_and_answers_are_reused(
    server: PickerServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(server_module, "tracer", provider.get_tracer("test"))
    first = await _exchange(server, [_headers(eos=False), _body("s" * 640)])
    (span,) = exporter.get_finished_spans()
    assert span.name == "picker.pick" and span.attributes is not None
    assert span.attributes["picker.winner"] == _destination(first[1])[0].split(",")[0]
    assert span.attributes["picker.candidates"] == len(ENDPOINTS)
    assert set(json.loads(str(span.attributes["picker.scores"]))) == set(ENDPOINTS)
    # a second stream with the same prompt goes to the same winner (the fallbacks after it
    # may tie and be ordered at random), and is traced too
    second = await _exchange(server, [_headers(eos=False), _body("s" * 640)])
    winner = _destination(first[1])[0].split(",")[0]
    assert _destination(second[1])[0].split(",")[0] == winner
    assert len(exporter.get_finished_spans()) == 2
    # an answer is serialized once per endpoint list and phase, then reused
    listed = tuple(ENDPOINTS)
    assert server_module._answer_bytes(listed, "body") is server_module._answer_bytes(
        listed, "body"
    )


async def test_health_service(server: PickerServer) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        check = channel.unary_unary(
            HEALTH_METHOD, request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        for name in ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor", ""):
            request = b"" if not name else b"\x0a" + bytes([len(name)]) + name.encode()
            assert await check(request) == b"\x08\x01", name  # SERVING
        server.pools.clear()
        assert await check(b"\x0a\x09readiness") == b"\x08\x02"  # NOT_SERVING: no pool
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await check(b"\x0a\x03foo")
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    assert decode_service(b"\x0a\x03abc") == "abc" and decode_service(b"") == ""


def _duplex(request: ep_pb2.ProcessingRequest) -> ep_pb2.ProcessingRequest:
    """``request`` as a gateway streaming the body sends its first message."""
    mode = processing_mode_pb2.ProcessingMode
    request.protocol_config.request_body_mode = mode.FULL_DUPLEX_STREAMED
    return request


def _chunk(data: bytes, end: bool = False) -> ep_pb2.ProcessingRequest:
    return ep_pb2.ProcessingRequest(request_body=ep_pb2.HttpBody(body=data, end_of_stream=end))


def _streamed(response: ep_pb2.ProcessingResponse) -> tuple[bytes, bool]:
    part = response.request_body.response.body_mutation.streamed_response
    return part.body, part.end_of_stream


async def test_a_streamed_body_is_answered_once_whole_then_sent_back(
    server: PickerServer,
) -> None:
    """FULL_DUPLEX_STREAMED: no answer until the body has ended; then the headers' answer
    carries the pick (header and metadata) and the body comes back whole."""
    body = json.dumps({"model": "m", "prompt": "a shared prefix " * 20}).encode()
    head, sent = await _exchange(
        server, [_duplex(_headers(False)), _chunk(body[:30]), _chunk(body[30:], end=True)]
    )
    (header,) = head.request_headers.response.header_mutation.set_headers
    winner = header.header.raw_value.decode().split(",")[0]
    assert winner in ENDPOINTS
    metadata = json_format.MessageToDict(head.dynamic_metadata)
    assert metadata["envoy.lb"]["x-gateway-destination-endpoint"].split(",")[0] == winner
    assert _streamed(sent) == (body, True)


async def test_a_streamed_body_past_the_hold_limit_is_picked_by_load_and_passed_on(
    server: PickerServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_module, "MAX_HELD_BODY_BYTES", 16)
    parts = [b"x" * 10, b"y" * 10, b"z" * 10]
    answers = await _exchange(
        server,
        [_duplex(_headers(False)), _chunk(parts[0]), _chunk(parts[1]), _chunk(parts[2], True)],
    )
    head, *rest = answers
    assert head.request_headers.response.header_mutation.set_headers  # picked at 20 bytes
    assert [_streamed(a) for a in rest] == [(parts[0] + parts[1], False), (parts[2], True)]


async def test_a_streamed_body_ended_by_trailers_is_answered_in_order(
    server: PickerServer,
) -> None:
    body = json.dumps({"model": "m", "prompt": "hello"}).encode()
    trailers = ep_pb2.ProcessingRequest(request_trailers=ep_pb2.HttpTrailers())
    head, sent, after = await _exchange(server, [_duplex(_headers(False)), _chunk(body), trailers])
    assert head.HasField("request_headers") and _streamed(sent) == (body, False)
    assert after.HasField("request_trailers")
