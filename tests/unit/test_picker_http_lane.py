"""The picker's ``transport: http`` side on loopback, without Envoy: the HTTP lane's answers to
ext_authz's questions (200 with the ordered destinations and a ticket, 503 for no endpoint or
an unknown service, 429 when shedding, the session header read), requests one after another
on a keep-alive connection, and the gRPC access log service ending exactly the picks its
entries' tickets name (a forged or stale ticket ends nothing), and each pick's span."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import grpc
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from inferway._xds_protos.envoy.data.accesslog.v3 import accesslog_pb2
from inferway._xds_protos.envoy.service.accesslog.v3 import als_pb2
from inferway.gateway.picker import server as server_module
from inferway.gateway.picker.core.metrics import ServerMetrics
from inferway.gateway.picker.core.picker import Picker, PickerConfig
from inferway.gateway.picker.core.scorers import Weights
from inferway.gateway.picker.http_lane import PickerHttpServer
from inferway.gateway.picker.server import PickerServer, PoolPicker

pytestmark = pytest.mark.asyncio
ENDPOINTS = ["127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003"]
ALS_METHOD = "/envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs"


@pytest.fixture
async def servers() -> AsyncIterator[tuple[PickerHttpServer, PickerServer, PoolPicker]]:
    picker = Picker(PickerConfig(weights=Weights(session=5), fallbacks=2, queue_limit=2, shed=True))
    picker.set_endpoints(ENDPOINTS)
    pool = PoolPicker(picker, session_header="x-session-id")
    lane = await PickerHttpServer("127.0.0.1", 0).start()
    grpc_server = await PickerServer("127.0.0.1", 0).start()
    lane.pools["llm"] = grpc_server.pools["llm"] = pool
    try:
        yield lane, grpc_server, pool
    finally:
        await lane.stop()
        await grpc_server.stop()


def _request(service: str, prompt: str | None, headers: str = "") -> bytes:
    body = b"" if prompt is None else json.dumps({"model": "m", "prompt": prompt}).encode()
    return (
        f"POST /pick/{service}/v1/completions HTTP/1.1\r\nhost: picker\r\n{headers}"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body


async def _answers(port: int, requests: list[bytes]) -> list[tuple[int, dict[str, str], bytes]]:
    """Send ``requests`` on one connection, one after another: (status, headers, body) each."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answers = []
    try:
        for request in requests:
            writer.write(request)
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            headers = dict(line.split(": ", 1) for line in head[1:] if line)
            body = await reader.readexactly(int(headers["content-length"]))
            answers.append((int(head[0].split()[1]), headers, body))
    finally:
        writer.close()
    return answers


async def _log(port: int, tickets: list[str | None]) -> None:
    """Envoy's gRPC access log: one message with an entry per ticket (None: no header)."""
    entries = []
    for ticket in tickets:
        entry = accesslog_pb2.HTTPAccessLogEntry()
        if ticket is not None:
            entry.request.request_headers["x-inferway-picker-ticket"] = ticket
        entries.append(entry)
    message = als_pb2.StreamAccessLogsMessage(
        identifier=als_pb2.StreamAccessLogsMessage.Identifier(log_name="inferway.picker.llm"),
        http_logs=als_pb2.StreamAccessLogsMessage.HTTPAccessLogEntries(log_entry=entries),
    )
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_unary(
            ALS_METHOD, request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=lambda b: b,
        )  # fmt: skip
        assert await call(iter([message])) == b""


def _in_flight(pool: PoolPicker) -> int:
    return int(sum(s["in_flight"] or 0 for s in pool.picker.stats().values()))


async def test_picks_answer_with_destinations_and_tickets_that_the_access_log_ends(
    servers: tuple[PickerHttpServer, PickerServer, PoolPicker],
) -> None:
    lane, grpc_server, pool = servers
    answers = await _answers(lane.port, [_request("llm", "s" * 640), _request("llm", "t" * 640)])
    assert [a[0] for a in answers] == [200, 200]
    tickets = []
    for _, headers, body in answers:
        destinations = headers["x-gateway-destination-endpoint"].split(",")
        assert sorted(destinations) == sorted(ENDPOINTS) and body == b""  # + 2 fallbacks
        tickets.append(headers["x-inferway-picker-ticket"])
    assert all(t.startswith(f"llm.{pool.nonce}.") for t in tickets) and len(set(tickets)) == 2
    assert lane.requests == 2 and _in_flight(pool) == 2
    forged = [f"llm.{'0' * 12}.0", "other.x.1", "garbage", f"llm.{pool.nonce}.x"]
    await _log(grpc_server.port, [*forged, None])
    assert _in_flight(pool) == 2 and grpc_server.finished == 0  # nothing ended
    await _log(grpc_server.port, tickets)
    assert _in_flight(pool) == 0 and grpc_server.finished == 2


async def test_the_session_header_sticks_and_a_bodyless_request_is_picked(
    servers: tuple[PickerHttpServer, PickerServer, PoolPicker],
) -> None:
    lane, _, _ = servers
    session = "X-Session-Id: user-7\r\n"
    answers = await _answers(
        lane.port, [_request("llm", None, session), _request("llm", None, session)]
    )
    first, second = (a[1]["x-gateway-destination-endpoint"].split(",")[0] for a in answers)
    assert [a[0] for a in answers] == [200, 200] and first == second


async def test_unknown_service_no_endpoint_and_shedding(
    servers: tuple[PickerHttpServer, PickerServer, PoolPicker],
) -> None:
    lane, _, pool = servers
    ((status, headers, body),) = await _answers(lane.port, [_request("nosuch", "x")])
    assert status == 503 and headers["content-type"] == "application/json"
    assert "no picker for this service" in json.loads(body)["error"]
    for endpoint in ENDPOINTS:
        pool.picker.observe(endpoint, ServerMetrics(waiting=3))
    ((status, _, body),) = await _answers(lane.port, [_request("llm", "x")])
    assert status == 429 and "saturated" in json.loads(body)["error"]
    pool.picker.set_endpoints([])
    ((status, _, body),) = await _answers(lane.port, [_request("llm", "x")])
    assert status == 503 and json.loads(body)["status"] == 503
    assert _in_flight(pool) == 0  # a refused pick is not in flight


async def test_a_malformed_request_closes_the_connection(
    servers: tuple[PickerHttpServer, PickerServer, PoolPicker],
) -> None:
    lane, _, _ = servers
    reader, writer = await asyncio.open_connection("127.0.0.1", lane.port)
    writer.write(b"NOT HTTP AT ALL\r\n\r\n")
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()


async def test_a_recorded_span_explains_an_http_pick(
    servers: tuple[PickerHttpServer, PickerServer, PoolPicker], monkeypatch: pytest.MonkeyPatch
) -> None:
    lane, _, _ = servers
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(server_module, "tracer", provider.get_tracer("test"))
    ((status, headers, _),) = await _answers(lane.port, [_request("llm", "u" * 640)])
    (span,) = exporter.get_finished_spans()
    assert status == 200 and span.name == "picker.pick" and span.attributes is not None
    winner = headers["x-gateway-destination-endpoint"].split(",")[0]
    assert span.attributes["picker.winner"] == winner
    assert set(json.loads(str(span.attributes["picker.scores"]))) == set(ENDPOINTS)
