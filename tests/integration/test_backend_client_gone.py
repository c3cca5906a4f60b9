"""A client that goes away before its batch starts is not computed, and is counted as cancelled
(HTTP 499, gRPC CANCELLED) on every wire. Real servers and clients on loopback."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import numpy as np
import pytest

from inferway.backends.protocol import pb2
from inferway.devtools.demo_models import build_add
from tests.backend_helpers import grpc_stub, running_backend
from tests.prometheus_text import parse_exposition, sample_value

pytestmark = pytest.mark.integration

CLIENTS = 6
WINDOW_S = 8.0  # long enough that nothing here is dispatched by the window
SLOW = {"batching": {"mode": "fixed", "max_batch_size": 64, "max_queue_delay_s": WINDOW_S}}


@pytest.fixture
async def backend(tmp_path: Path):
    build_add(tmp_path / "slow" / "1" / "model.onnx")
    (tmp_path / "slow" / "config.yaml").write_text(json.dumps(SLOW))
    async with running_backend(tmp_path) as handle:
        yield handle


async def _poll(predicate, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def _counted(backend, **labels: str) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", backend.http_port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    raw = await reader.read()
    writer.close()
    text = raw.partition(b"\r\n\r\n")[2].decode()
    return sample_value(parse_exposition(text), **labels)


async def _nothing_computed(backend) -> None:
    executor = backend.repository.get("slow").executor
    await _poll(lambda: executor.queue_depth == 0, "abandoned requests still queued")
    assert executor.in_flight_batches == 0
    batches = await _counted(backend, name="inferway_backend_batch_size_count", model="slow")
    assert batches == 0, "an abandoned request was computed"


def _grpc_request() -> pb2.ModelInferRequest:
    req = pb2.ModelInferRequest(model_name="slow")
    for n in ("a", "b"):
        req.inputs.add(name=n, datatype="FP32", shape=[1, 4])
        req.raw_input_contents.append(np.ones((1, 4), np.float32).tobytes())
    return req


async def test_http_clients_that_hang_up_are_not_computed_and_count_as_499(backend) -> None:
    body = json.dumps(
        {
            "inputs": [
                {"name": n, "datatype": "FP32", "shape": [1, 4], "data": [1] * 4} for n in "ab"
            ]
        }
    ).encode()
    head = (
        "POST /v2/models/slow/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    writers = []
    for _ in range(CLIENTS):
        _, writer = await asyncio.open_connection("127.0.0.1", backend.http_port)
        writer.write(head + body)
        writers.append(writer)
    executor = backend.repository.get("slow").executor
    await _poll(lambda: executor.queue_depth == CLIENTS, "requests never queued")
    for writer in writers:
        writer.close()
    await _nothing_computed(backend)
    cancelled = await _counted(
        backend, name="inferway_backend_requests_total", protocol="http", code="499"
    )
    assert cancelled == CLIENTS
    assert await _counted(backend, name="inferway_backend_requests_total", code="200") == 0


async def test_cancelled_grpc_calls_are_not_computed_and_count_as_cancelled(backend) -> None:
    async with grpc_stub(backend) as stub:
        calls = [stub.ModelInfer(_grpc_request()) for _ in range(CLIENTS)]
        executor = backend.repository.get("slow").executor
        await _poll(lambda: executor.queue_depth == CLIENTS, "calls never queued")
        for call in calls:
            call.cancel()
        await _nothing_computed(backend)
    await _poll_count(backend, "grpc", CLIENTS)


async def test_a_broken_stream_drops_its_queued_requests_and_counts_them(backend) -> None:
    async with grpc_stub(backend) as stub:
        call = stub.ModelStreamInfer()
        for _ in range(CLIENTS):
            await call.write(_grpc_request())
        executor = backend.repository.get("slow").executor
        await _poll(lambda: executor.queue_depth == CLIENTS, "stream requests never queued")
        call.cancel()
        await _nothing_computed(backend)
    await _poll_count(backend, "grpc_stream", CLIENTS)


async def _poll_count(backend, protocol: str, expected: int) -> None:
    """The server learns of a cancel a moment after the client: poll for the count."""
    deadline = time.monotonic() + 5
    while True:
        got = await _counted(
            backend, name="inferway_backend_requests_total", protocol=protocol, code="CANCELLED"
        )
        if got == expected:
            return
        assert time.monotonic() < deadline, f"{got} of {expected} counted as CANCELLED"
        await asyncio.sleep(0.02)
