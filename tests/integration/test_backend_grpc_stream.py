"""ModelStreamInfer (Triton's streaming extension) over real gRPC on loopback: many requests
on one stream batch together, every request gets exactly one answer matched by id, failures
answer with error_message and leave the stream open, half-close finishes what was read."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import numpy as np
import pytest

from inferway.backends.protocol import pb2
from inferway.backends.telemetry.orca import parse_orca_header
from inferway.devtools.demo_models import mlp_reference, write_demo_repository
from tests.backend_helpers import grpc_stub, running_backend

pytestmark = pytest.mark.integration

SIZES = (8, 16, 4)
WINDOW = {"batching": {"mode": "fixed", "max_batch_size": 64, "max_queue_delay_s": 0.05}}


@pytest.fixture
async def backend(tmp_path: Path):
    write_demo_repository(tmp_path, "mlp", sizes=SIZES, config=WINDOW)
    async with running_backend(tmp_path) as handle:
        yield handle


@pytest.fixture
async def stub(backend):
    async with grpc_stub(backend) as stub:
        yield stub


def _request(x: np.ndarray, rid: str, model: str = "mlp") -> pb2.ModelInferRequest:
    req = pb2.ModelInferRequest(model_name=model, id=rid)
    req.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
    req.raw_input_contents.append(x.tobytes())
    return req


async def test_requests_on_one_stream_batch_together_and_each_gets_its_own_answer(
    backend, stub
) -> None:
    rng = np.random.default_rng(7)
    rows = {f"r{i}": rng.standard_normal((1, 8)).astype(np.float32) for i in range(40)}
    call = stub.ModelStreamInfer(_request(x, rid) for rid, x in rows.items())
    answers = [a async for a in call]
    assert await call.code() == grpc.StatusCode.OK
    assert sorted(a.infer_response.id for a in answers) == sorted(rows)  # one each, no extra
    for a in answers:
        assert a.error_message == ""
        y = np.frombuffer(a.infer_response.raw_output_contents[0], np.float32).reshape(1, 4)
        want = mlp_reference(rows[a.infer_response.id], SIZES)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
    # 40 requests sent back to back inside a 50 ms window: far fewer batches than requests.
    text = backend.metrics.render().decode()
    batches = next(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("inferway_backend_batch_size_count")
    )
    assert batches < 20, text
    trailers = dict(await call.trailing_metadata())
    assert parse_orca_header(trailers["endpoint-load-metrics"])["rps_fractional"] >= 0
    assert 'protocol="grpc_stream"' in text


async def test_a_bad_request_is_answered_with_an_error_and_the_stream_goes_on(stub) -> None:
    good = np.ones((1, 8), np.float32)
    requests = [
        _request(good, "ok-1"),
        _request(good, "nope", model="missing"),
        _request(np.ones((1, 3), np.float32), "bad-shape"),
        _request(good, "ok-2"),
    ]
    call = stub.ModelStreamInfer(iter(requests))
    answers = {a.infer_response.id: a async for a in call}
    assert await call.code() == grpc.StatusCode.OK
    assert set(answers) == {"ok-1", "nope", "bad-shape", "ok-2"}
    assert answers["ok-1"].error_message == answers["ok-2"].error_message == ""
    assert answers["nope"].error_message.startswith("NOT_FOUND: ")
    assert "missing" in answers["nope"].error_message
    assert answers["bad-shape"].error_message.startswith("INVALID_ARGUMENT: ")
    assert answers["bad-shape"].infer_response.model_name == "mlp"


async def test_answers_flow_while_the_client_keeps_the_stream_open(stub) -> None:
    """A bidirectional conversation: each answer arrives before the next request is sent."""
    outbox: asyncio.Queue[pb2.ModelInferRequest | None] = asyncio.Queue()

    async def requests():
        while (req := await outbox.get()) is not None:
            yield req

    call = stub.ModelStreamInfer(requests())
    for i in range(5):
        await outbox.put(_request(np.full((1, 8), i, np.float32), f"turn-{i}"))
        answer = await asyncio.wait_for(call.read(), timeout=5)
        assert answer.infer_response.id == f"turn-{i}" and answer.error_message == ""
    await outbox.put(None)
    assert await call.read() == grpc.aio.EOF
    assert await call.code() == grpc.StatusCode.OK


async def test_client_cancelling_the_stream_leaves_the_server_serving(backend, stub) -> None:
    outbox: asyncio.Queue[pb2.ModelInferRequest] = asyncio.Queue()

    async def requests():
        while True:
            yield await outbox.get()

    call = stub.ModelStreamInfer(requests())
    await outbox.put(_request(np.ones((1, 8), np.float32), "a"))
    assert (await asyncio.wait_for(call.read(), timeout=5)).infer_response.id == "a"
    call.cancel()
    # The server is unharmed: a new stream and a unary call both work.
    again = [
        a
        async for a in stub.ModelStreamInfer(
            iter([_request(np.ones((1, 8)).astype(np.float32), "b")])
        )
    ]
    assert [a.infer_response.id for a in again] == ["b"]
    unary = await stub.ModelInfer(_request(np.ones((1, 8), np.float32), "c"))
    assert unary.id == "c"
    assert backend.repository.get("mlp").executor.queue_depth == 0
