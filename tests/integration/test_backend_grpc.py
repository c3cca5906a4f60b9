"""The backend over real gRPC on loopback: inference.GRPCInferenceService with raw and typed
contents, metadata, readiness, ORCA metadata, status codes and the client's deadline."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from inferway.backends.app import build_repository, serve_repository
from inferway.backends.protocol import pb2, pb2_grpc
from inferway.backends.telemetry.orca import parse_orca_header
from inferway.devtools.demo_models import build_add, mlp_reference, write_demo_repository
from inferway.observability.otel import setup_tracing
from tests.backend_helpers import grpc_stub, running_backend

pytestmark = pytest.mark.integration

SIZES = (8, 16, 4)
BAD = grpc.StatusCode.INVALID_ARGUMENT
MISSING = grpc.StatusCode.NOT_FOUND
SLOW = {
    "batching": {
        "mode": "fixed",
        "max_batch_size": 64,
        "max_queue_delay_s": 1.0,
        "max_queue_size": 1,
    }
}


def _write_repo(root: Path) -> Path:
    build_add(root / "add" / "1" / "model.onnx")
    write_demo_repository(root, "mlp", sizes=SIZES, config={"batching": {"max_batch_size": 8}})
    write_demo_repository(root, "slow", sizes=SIZES, config=SLOW)
    return root


@pytest.fixture
async def backend(tmp_path: Path):
    async with running_backend(_write_repo(tmp_path)) as handle:
        yield handle


@pytest.fixture
async def stub(backend):
    async with grpc_stub(backend) as stub:
        yield stub


def _mlp_request(x: np.ndarray, *, raw: bool, model: str = "mlp") -> pb2.ModelInferRequest:
    req = pb2.ModelInferRequest(model_name=model, id="g1")
    tensor = req.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
    if raw:
        req.raw_input_contents.append(x.tobytes())
    else:
        tensor.contents.fp32_contents.extend(x.ravel().tolist())
    return req


async def test_model_infer_with_raw_contents_matches_numpy(stub) -> None:
    x = np.random.default_rng(2).standard_normal((5, 8)).astype(np.float32)
    resp = await stub.ModelInfer(_mlp_request(x, raw=True))
    assert resp.model_name == "mlp" and resp.model_version == "1" and resp.id == "g1"
    out = resp.outputs[0]
    assert out.name == "y" and out.datatype == "FP32" and list(out.shape) == [5, 4]
    y = np.frombuffer(resp.raw_output_contents[0], np.float32).reshape(5, 4)
    np.testing.assert_allclose(y, mlp_reference(x, SIZES), rtol=1e-4, atol=1e-5)


async def test_model_infer_with_typed_contents_answers_typed(stub) -> None:
    x = np.random.default_rng(3).standard_normal((2, 8)).astype(np.float32)
    resp = await stub.ModelInfer(_mlp_request(x, raw=False))
    assert not resp.raw_output_contents
    y = np.array(resp.outputs[0].contents.fp32_contents, np.float32).reshape(2, 4)
    np.testing.assert_allclose(y, mlp_reference(x, SIZES), rtol=1e-4, atol=1e-5)


async def test_health_and_metadata_rpcs(stub) -> None:
    assert (await stub.ServerLive(pb2.ServerLiveRequest())).live
    assert (await stub.ServerReady(pb2.ServerReadyRequest())).ready
    server = await stub.ServerMetadata(pb2.ServerMetadataRequest())
    assert server.name == "inferway" and "binary_tensor_data" in server.extensions
    assert (await stub.ModelReady(pb2.ModelReadyRequest(name="add", version="1"))).ready
    meta = await stub.ModelMetadata(pb2.ModelMetadataRequest(name="add"))
    assert meta.name == "add" and list(meta.versions) == ["1"] and meta.platform == "onnxruntime"
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
        ("a", "FP32", [-1, 4]),
        ("b", "FP32", [-1, 4]),
    ]
    assert [t.name for t in meta.outputs] == ["sum", "diff"]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ModelMetadata(pb2.ModelMetadataRequest(name="ghost"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND and "ghost" in info.value.details()


async def test_orca_report_rides_trailing_metadata_once(stub) -> None:
    # Envoy reads the report from the headers or else the trailers; it is sent once, at the end.
    call = stub.ModelInfer(_mlp_request(np.ones((1, 8), np.float32), raw=True))
    await call
    assert "endpoint-load-metrics" not in dict(await call.initial_metadata())
    report = parse_orca_header(dict(await call.trailing_metadata())["endpoint-load-metrics"])
    assert report["rps_fractional"] > 0
    assert 0 <= report["application_utilization"] <= 1


@pytest.mark.parametrize(
    ("mutate", "code", "text"),
    [
        (lambda r: setattr(r.inputs[0], "name", "zz"), BAD, "unknown input 'zz'"),
        (
            lambda r: setattr(r.inputs[0], "datatype", "FP64"),
            BAD,
            "does not match the model's FP32",
        ),
        (lambda r: r.inputs[0].shape.__setitem__(1, 9), BAD, "dimension 1 is 9"),
        (lambda r: r.raw_input_contents.__setitem__(0, b"\0" * 3), BAD, "raw data is 3 bytes"),
        (lambda r: setattr(r, "model_name", "ghost"), MISSING, "model 'ghost' not found"),
        (lambda r: setattr(r, "model_version", "7"), MISSING, "no version 7"),
        (lambda r: r.outputs.add(name="nope"), BAD, "unknown output 'nope'"),
    ],
)
async def test_bad_requests_map_to_grpc_codes_with_messages(stub, mutate, code, text) -> None:
    req = _mlp_request(np.ones((1, 8), np.float32), raw=True)
    mutate(req)
    call = stub.ModelInfer(req)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == code
    assert text in info.value.details()
    assert "endpoint-load-metrics" in dict(info.value.trailing_metadata())


async def _wait_queued(backend, model: str, depth: int) -> None:
    executor = backend.repository.get(model).executor
    deadline = time.monotonic() + 5
    while executor.queue_depth < depth:
        assert time.monotonic() < deadline, "request never queued"
        await asyncio.sleep(0.01)


async def test_queue_full_is_resource_exhausted_with_retry_hint(backend, stub) -> None:
    first = asyncio.ensure_future(
        stub.ModelInfer(_mlp_request(np.ones((1, 8), np.float32), raw=True, model="slow"))
    )
    await _wait_queued(backend, "slow", 1)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ModelInfer(_mlp_request(np.ones((1, 8), np.float32), raw=True, model="slow"))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "retry after" in info.value.details()
    assert int(dict(info.value.trailing_metadata())["grpc-retry-pushback-ms"]) > 0
    assert (await first).model_name == "slow"  # the queued request still gets its answer


async def test_client_deadline_is_honoured_and_frees_the_queue(backend, stub) -> None:
    req = _mlp_request(np.ones((1, 8), np.float32), raw=True, model="slow")
    started = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ModelInfer(req, timeout=0.2)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 0.9  # did not wait for the 1 s batch window
    # The server dropped the expired request: the one-slot queue takes a new one at once.
    executor = backend.repository.get("slow").executor
    deadline = time.monotonic() + 2
    while executor.queue_depth:
        assert time.monotonic() < deadline, "expired request still queued"
        await asyncio.sleep(0.01)
    resp = await stub.ModelInfer(req, timeout=5)
    assert resp.model_name == "slow"


async def test_not_ready_server_answers_unavailable(tmp_path: Path) -> None:
    repository, metrics = build_repository(_write_repo(tmp_path))
    handle = await serve_repository(repository, metrics)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{handle.grpc_port}") as channel:
            stub = pb2_grpc.GRPCInferenceServiceStub(channel)
            assert not (await stub.ServerReady(pb2.ServerReadyRequest())).ready
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelInfer(_mlp_request(np.ones((1, 8), np.float32), raw=True))
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            await repository.start(watch=False)
            assert (await stub.ServerReady(pb2.ServerReadyRequest())).ready
            assert (
                await stub.ModelInfer(_mlp_request(np.ones((1, 8), np.float32), raw=True))
            ).outputs
    finally:
        await handle.stop()


@pytest.fixture(scope="module")
def spans() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = setup_tracing("inferway-test")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


async def test_traceparent_metadata_parents_the_request_span(stub, spans) -> None:
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    parent_id = "b7ad6b7169203331"
    metadata = (("traceparent", f"00-{trace_id}-{parent_id}-01"),)
    await stub.ModelInfer(_mlp_request(np.ones((1, 8), np.float32), raw=True), metadata=metadata)
    deadline = time.monotonic() + 5
    found = []
    while not found and time.monotonic() < deadline:
        found = [
            s
            for s in spans.get_finished_spans()
            if s.name == "infer mlp" and s.context.trace_id == int(trace_id, 16)
        ]
        await asyncio.sleep(0.02)
    assert found, "no request span continued the client's trace"
    span = found[0]
    assert span.parent is not None and span.parent.span_id == int(parent_id, 16)
    assert span.attributes["inferway.status_code"] == "OK"
    assert span.attributes["inferway.model_version"] == "1"
