"""The backend over real HTTP on loopback: KServe v2 JSON and binary inference, metadata,
health, ORCA load reports, Prometheus metrics and trace propagation."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from inferway.backends.app import build_repository, serve_repository
from inferway.backends.telemetry.orca import parse_orca_header
from inferway.devtools.demo_models import build_add, mlp_reference, write_demo_repository
from inferway.observability.otel import setup_tracing
from tests.backend_helpers import http_session, running_backend

pytestmark = pytest.mark.integration

SIZES = (8, 16, 4)


def _write_repo(root: Path) -> Path:
    build_add(root / "add" / "1" / "model.onnx")
    write_demo_repository(
        root, "mlp", versions=(1, 2), sizes=SIZES, config={"batching": {"max_batch_size": 8}}
    )
    return root


@pytest.fixture
async def backend(tmp_path: Path):
    async with running_backend(_write_repo(tmp_path)) as handle:
        yield handle


@pytest.fixture
async def http(backend):
    async with http_session(backend) as session:
        yield session


@pytest.fixture(scope="module")
def spans() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = setup_tracing("inferway-test")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


def _x_input(x: np.ndarray) -> dict:
    return {"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}


async def test_json_inference_matches_numpy_for_latest_and_pinned_versions(http) -> None:
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    async with http.post("/v2/models/mlp/infer", json={"id": "q1", "inputs": [_x_input(x)]}) as r:
        assert r.status == 200, await r.text()
        latest = await r.json()
    assert latest["id"] == "q1" and latest["model_version"] == "2"
    out = latest["outputs"][0]
    assert out["name"] == "y" and out["datatype"] == "FP32" and out["shape"] == [3, 4]
    expected = mlp_reference(x, SIZES, seed=1)
    np.testing.assert_allclose(np.array(out["data"]).reshape(3, 4), expected, rtol=1e-4, atol=1e-5)
    async with http.post("/v2/models/mlp/versions/1/infer", json={"inputs": [_x_input(x)]}) as r:
        pinned = await r.json()
    assert pinned["model_version"] == "1" and "id" not in pinned
    np.testing.assert_allclose(
        np.array(pinned["outputs"][0]["data"]).reshape(3, 4),
        mlp_reference(x, SIZES, seed=0),
        rtol=1e-4,
        atol=1e-5,
    )


async def test_nested_data_and_output_selection(http) -> None:
    body = {
        "inputs": [
            {
                "name": "a",
                "datatype": "FP32",
                "shape": [2, 4],
                "data": [[1, 2, 3, 4], [5, 6, 7, 8]],
            },
            {"name": "b", "datatype": "FP32", "shape": [2, 4], "data": [[1] * 4, [2] * 4]},
        ],
        "outputs": [{"name": "diff"}],
    }
    async with http.post("/v2/models/add/infer", json=body) as r:
        assert r.status == 200
        doc = await r.json()
    assert [o["name"] for o in doc["outputs"]] == ["diff"]
    assert doc["outputs"][0]["data"] == [0, 1, 2, 3, 3, 4, 5, 6]


async def test_binary_extension_round_trip_request_and_response(http) -> None:
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.full((2, 4), 0.5, dtype=np.float32)
    header = {
        "inputs": [
            {"name": n, "datatype": "FP32", "shape": [2, 4], "parameters": {"binary_data_size": 32}}
            for n in ("a", "b")
        ],
        "outputs": [{"name": "sum", "parameters": {"binary_data": True}}, {"name": "diff"}],
    }
    head = json.dumps(header).encode()
    async with http.post(
        "/v2/models/add/infer",
        data=head + a.tobytes() + b.tobytes(),
        headers={
            "Inference-Header-Content-Length": str(len(head)),
            "Content-Type": "application/octet-stream",
        },
    ) as r:
        assert r.status == 200, await r.text()
        size = int(r.headers["Inference-Header-Content-Length"])
        body = await r.read()
    doc = json.loads(body[:size])
    summ, diff = doc["outputs"]
    assert summ["parameters"]["binary_data_size"] == 32 and "data" not in summ
    np.testing.assert_array_equal(np.frombuffer(body[size:], np.float32).reshape(2, 4), a + b)
    np.testing.assert_array_equal(np.array(diff["data"]).reshape(2, 4), a - b)
    # binary_data_output makes every output binary
    plain = {
        "inputs": [
            {"name": n, "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]} for n in "ab"
        ],
        "parameters": {"binary_data_output": True},
    }
    async with http.post("/v2/models/add/infer", json=plain) as r:
        size = int(r.headers["Inference-Header-Content-Length"])
        body = await r.read()
    assert [o["parameters"]["binary_data_size"] for o in json.loads(body[:size])["outputs"]] == [
        16,
        16,
    ]
    np.testing.assert_array_equal(np.frombuffer(body[size : size + 16], np.float32), [2, 4, 6, 8])


async def test_metadata_and_health_endpoints(http) -> None:
    async with http.get("/v2") as r:
        server = await r.json()
    assert server["name"] == "inferway" and "binary_tensor_data" in server["extensions"]
    async with http.get("/v2/health/live") as r:
        assert r.status == 200
    async with http.get("/v2/health/ready") as r:
        assert r.status == 200 and (await r.json())["ready"] is True
    async with http.get("/v2/models/mlp") as r:
        meta = await r.json()
    assert meta["name"] == "mlp" and meta["versions"] == ["1", "2"]
    assert meta["platform"] == "onnxruntime"
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 8]}]
    assert meta["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}]
    async with http.get("/v2/models/mlp/versions/1/ready") as r:
        assert r.status == 200 and (await r.json())["ready"] is True
    async with http.get("/v2/models/mlp/versions/9/ready") as r:
        assert r.status == 404 and "no version 9" in (await r.json())["error"]
    async with http.get("/v2/models/ghost") as r:
        assert r.status == 404 and "model 'ghost' not found" in (await r.json())["error"]


async def test_readiness_is_false_until_the_repository_has_loaded(tmp_path: Path) -> None:
    repository, metrics = build_repository(_write_repo(tmp_path))
    handle = await serve_repository(repository, metrics)
    try:
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{handle.http_port}") as s:
            async with s.get("/v2/health/live") as r:
                assert r.status == 200
            async with s.get("/v2/health/ready") as r:
                assert r.status == 503 and (await r.json()) == {"ready": False}
            body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0] * 8}]}
            async with s.post("/v2/models/mlp/infer", json=body) as r:
                assert r.status == 503 and "still loading" in (await r.json())["error"]
            await repository.start(watch=False)
            async with s.get("/v2/health/ready") as r:
                assert r.status == 200
            async with s.post("/v2/models/mlp/infer", json=body) as r:
                assert r.status == 200
    finally:
        await handle.stop()


async def test_every_response_carries_a_parseable_orca_report(http) -> None:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [1] * 8}]}
    for _ in range(5):
        async with http.post("/v2/models/mlp/infer", json=body) as r:
            assert r.status == 200
    for method, path in [
        ("POST", "/v2/models/mlp/infer"),
        ("GET", "/v2/models/ghost"),
        ("GET", "/nope"),
        ("GET", "/v2/health/ready"),
    ]:
        async with http.request(method, path, json=body) as r:
            report = parse_orca_header(r.headers["endpoint-load-metrics"])
        assert report["rps_fractional"] > 0
        assert 0.0 <= report["application_utilization"] <= 1.0
        assert report["named_metrics.queue_depth"] >= 0
    # five requests just completed, so the recent rate is well above the idle floor
    assert report["rps_fractional"] > 0.01


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_metrics_endpoint_parses_and_counters_move(http) -> None:
    key = (
        "inferway_backend_requests_total",
        (("code", "200"), ("model", "add"), ("protocol", "http"), ("version", "1")),
    )
    batches = ("inferway_backend_batch_size_count", (("model", "add"), ("version", "1")))
    async with http.get("/metrics") as r:
        before = _samples(await r.text())
    body = {
        "inputs": [{"name": n, "datatype": "FP32", "shape": [1, 4], "data": [1] * 4} for n in "ab"]
    }
    for _ in range(3):
        async with http.post("/v2/models/add/infer", json=body) as r:
            assert r.status == 200
    async with http.post("/v2/models/add/infer", data=b"{bad") as r:
        assert r.status == 400
    async with http.post("/v2/models/ghost-1/infer", json=body) as r:
        assert r.status == 404
    async with http.get("/metrics") as r:
        after = _samples(await r.text())
    # a client-chosen model name never becomes a label value
    assert not any("ghost" in str(labels) for _, labels in after)
    unknown = (
        key[0],
        (("code", "404"), ("model", "_unknown"), ("protocol", "http"), ("version", "")),
    )
    assert after.get(unknown) == 1
    assert after[key] - before.get(key, 0.0) == 3
    bad = (key[0], (("code", "400"), *key[1][1:]))
    assert after[bad] == 1
    assert after[batches] - before.get(batches, 0.0) >= 1
    labels = (("model", "mlp"), ("version", "2"))
    assert after[("inferway_backend_queue_depth", labels)] == 0
    assert after[("inferway_backend_inflight_batches", labels)] == 0
    assert after[("inferway_backend_model_load_seconds", labels)] > 0
    # what the batcher saw of the loop (fill_when_busy): a share, and a count of its waits
    assert 0 <= after[("inferway_backend_loop_busy", labels)] <= 1
    assert after[("inferway_backend_batch_fill_waits", labels)] >= 0
    assert after[("inferway_backend_batch_return_waits", labels)] >= 0
    # where its batches computed (compute_thread): a count, present for every model
    assert after[("inferway_backend_batches_on_loop", labels)] >= 0
    assert (
        "inferway_backend_queue_wait_seconds_count",
        (("model", "add"), ("version", "1")),
    ) in after
    assert ("inferway_backend_compute_seconds_count", (("model", "add"), ("version", "1"))) in after


async def test_client_traceparent_parents_the_request_span_and_batch_links_it(
    http, spans: InMemorySpanExporter
) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    parent_id = "00f067aa0ba902b7"
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [1] * 8}]}
    async with http.post(
        "/v2/models/mlp/infer", json=body, headers={"traceparent": f"00-{trace_id}-{parent_id}-01"}
    ) as r:
        assert r.status == 200
    deadline = time.monotonic() + 5
    request_span = batch_span = None
    while time.monotonic() < deadline and (request_span is None or batch_span is None):
        for s in spans.get_finished_spans():
            if s.name == "infer mlp" and s.context.trace_id == int(trace_id, 16):
                request_span = s
        if request_span is not None:
            for s in spans.get_finished_spans():
                if s.name.startswith("batch mlp") and any(
                    link.context.span_id == request_span.context.span_id for link in s.links
                ):
                    batch_span = s
        await asyncio.sleep(0.02)
    assert request_span is not None, [s.name for s in spans.get_finished_spans()]
    assert request_span.parent is not None and request_span.parent.span_id == int(parent_id, 16)
    assert request_span.kind == trace.SpanKind.SERVER
    assert request_span.attributes["inferway.status_code"] == "200"
    assert batch_span is not None, "no batch span links to the request span"
