"""Pipelines served by a real backend over real HTTP and gRPC, with real ONNX Runtime and the
real batchers: answers equal the numpy chain, branches overlap, pipeline rows batch with
direct traffic, the mixture routes each row to its top 2 experts, cached steps answer
without computing, every step has its span, and a bad pipeline.yaml is refused with its
line while the old pipeline keeps serving."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import grpc
import numpy as np
import pytest
import yaml
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from inferway.backends.app import BackendHandle, start_backend
from inferway.backends.jobs.settings import JobSettings
from inferway.backends.protocol import pb2, pb2_grpc
from inferway.devtools.demo_pipelines import (
    CHAIN,
    MOE,
    chain_reference,
    moe_reference,
    write_chain_pipeline,
    write_moe_pipeline,
)
from tests.jobs_support import submit, wait_for_job
from tests.prometheus_text import parse_exposition, sample_value

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CPU = {"provider": "cpu", "intra_op_threads": 1}
# Each branch waits for a second row (left up to 1 s, right 0.25 s): one pipeline request
# keeps both branches queued at once (they overlap), and a direct request to the left model
# joins the pipeline's row in one batch.
WAITING = {
    name: {**CPU, "batching": {"mode": "fixed", "max_batch_size": 2, "max_queue_delay_s": delay}}
    for name, delay in (("chain_left", 1.0), ("chain_right", 0.25))
}


def _x(rows: int, width: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, width), dtype=np.float32)


def _json_request(x: np.ndarray) -> dict:
    shape = list(x.shape)
    return {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": shape, "data": x.ravel().tolist()}]
    }


def _outputs(body: dict) -> dict[str, np.ndarray]:
    return {
        o["name"]: np.asarray(o["data"], dtype=np.float32).reshape(o["shape"])
        for o in body["outputs"]
    }


class Stack:
    def __init__(self, root: Path, handle: BackendHandle, spans: InMemorySpanExporter) -> None:
        self.root = root
        self.handle = handle
        self.spans = spans
        self.http = aiohttp.ClientSession(base_url=f"http://127.0.0.1:{handle.http_port}")
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{handle.grpc_port}")
        self.grpc = pb2_grpc.GRPCInferenceServiceStub(self.channel)

    async def infer(self, model: str, x: np.ndarray) -> dict[str, np.ndarray]:
        async with self.http.post(f"/v2/models/{model}/infer", json=_json_request(x)) as r:
            body = await r.json()
            assert r.status == 200, body
            return _outputs(body)

    def metric(self, name: str, **labels: str) -> float:
        return sample_value(parse_exposition(self.handle.metrics.render().decode()), name, **labels)

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())


@asynccontextmanager
async def _stack(root: Path, *, watch: bool = False) -> AsyncIterator[Stack]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    handle = await start_backend(root, watch=watch, tracer_provider=provider)
    stack = Stack(root, handle, spans)
    try:
        yield stack
    finally:
        await stack.http.close()
        await stack.channel.close()
        await handle.stop()
        provider.shutdown()


async def _until(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached before the deadline"
        await asyncio.sleep(0.05)


def _write_chain(root: Path, **kwargs: object) -> Path:
    path = write_chain_pipeline(root, config=CPU, **kwargs)  # type: ignore[arg-type]
    for name, config in WAITING.items():
        (root / name / "config.yaml").write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    _write_chain(tmp_path)
    write_moe_pipeline(tmp_path, config=CPU)
    async with _stack(tmp_path) as s:
        yield s


async def test_rows_beyond_a_step_models_batch_limit_are_refused_naming_the_step(
    stack: Stack,
) -> None:
    async with stack.http.post("/v2/models/chain/infer", json=_json_request(_x(3, 32, 1))) as r:
        assert r.status == 400
        message = (await r.json())["error"]
    assert message.startswith("pipeline 'chain' step 'left': ") or message.startswith(
        "pipeline 'chain' step 'right': "
    )
    assert "3 rows exceed max_batch_size 2" in message


async def test_metadata_comes_from_the_pipelines_ends_over_http_and_grpc(stack: Stack) -> None:
    async with stack.http.get("/v2/models/chain") as r:
        meta = await r.json()
    assert meta["platform"] == "pipeline" and meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 32]}]
    assert [(o["name"], o["shape"]) for o in meta["outputs"]] == [
        ("left", [-1, 8]),
        ("right", [-1, 8]),
    ]
    grpc_meta = await stack.grpc.ModelMetadata(pb2.ModelMetadataRequest(name="chain"))
    assert grpc_meta.platform == "pipeline" and [t.name for t in grpc_meta.outputs] == [
        "left",
        "right",
    ]
    assert (await stack.grpc.ModelReady(pb2.ModelReadyRequest(name="chain"))).ready
    async with stack.http.get("/v2/models/chain/config") as r:
        config = await r.json()
    # Triton's name for it; the rows one request may carry are what its smallest step takes
    assert config["platform"] == "ensemble" and config["max_batch_size"] == 2
    async with stack.http.get("/v2/health/ready") as r:
        assert r.status == 200


async def test_the_chain_answers_what_numpy_computes_over_http_and_grpc(stack: Stack) -> None:
    x = _x(2, 32, 1)
    want = chain_reference(x)
    got = await stack.infer("chain", x)
    for name in ("left", "right"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)
    request = pb2.ModelInferRequest(model_name="chain", id="g")
    request.inputs.add(name="x", datatype="FP32", shape=[2, 32])
    request.raw_input_contents.append(x.tobytes())
    response = await stack.grpc.ModelInfer(request)
    assert response.model_name == "chain" and [o.name for o in response.outputs] == [
        "left",
        "right",
    ]
    left = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(2, 8)
    np.testing.assert_allclose(left, want["left"], rtol=1e-4, atol=1e-5)
    # the streaming RPC runs the pipeline too (the executor's submit path)
    call = stack.grpc.ModelStreamInfer(iter([request]))
    (answer,) = [a async for a in call]
    assert answer.error_message == ""
    right = np.frombuffer(answer.infer_response.raw_output_contents[1], np.float32).reshape(2, 8)
    np.testing.assert_allclose(right, want["right"], rtol=1e-4, atol=1e-5)


def _one(spans: list[ReadableSpan], name: str, trace_id: int) -> ReadableSpan:
    (span,) = [s for s in spans if s.name == name and s.context.trace_id == trace_id]
    return span


async def test_every_step_has_a_span_under_the_request_and_the_branches_overlap(
    stack: Stack,
) -> None:
    await stack.infer("chain", _x(1, 32, 2))
    spans = stack.finished()
    (request,) = [s for s in spans if s.name == "infer chain"]
    trace_id = request.context.trace_id
    steps = {n: _one(spans, f"step {n}", trace_id) for n in ("embed", "left", "right")}
    for span in steps.values():
        assert span.parent is not None and span.parent.span_id == request.context.span_id
        assert span.attributes["inferway.pipeline"] == "chain"
        # the batch that served the step links to the step's span, as to a request's span
        (batch,) = [
            s
            for s in spans
            if s.name.startswith("batch ")
            and any(link.context.span_id == span.context.span_id for link in s.links)
        ]
        assert batch.name == f"batch {span.attributes['inferway.model']}:1"
    left, right, embed = steps["left"], steps["right"], steps["embed"]
    assert embed.end_time <= min(left.start_time, right.start_time)  # the chain's order
    # each branch waited out its batching delay at the same time as the other
    assert left.start_time < right.end_time and right.start_time < left.end_time


async def test_pipeline_rows_batch_with_direct_traffic_to_the_same_model(stack: Stack) -> None:
    h = CHAIN[0].reference(_x(1, 32, 3))  # what the pipeline's embed step feeds chain_left
    pipeline = asyncio.ensure_future(stack.infer("chain", _x(1, 32, 3)))
    left = stack.handle.repository.get("chain_left").executor
    await _until(lambda: left.queue_depth == 1)  # the pipeline's row waits for company
    direct = await stack.infer("chain_left", h)
    await pipeline
    np.testing.assert_allclose(direct["y"], CHAIN[1].reference(h), rtol=1e-4, atol=1e-5)
    spans = stack.finished()
    step = next(s for s in spans if s.name == "step left")
    direct_span = next(s for s in spans if s.name == "infer chain_left")
    (batch,) = [
        s
        for s in spans
        if s.name == "batch chain_left:1"
        and {link.context.span_id for link in s.links}
        >= {step.context.span_id, direct_span.context.span_id}
    ]
    assert batch.attributes["batch.requests"] == 2 and batch.attributes["batch.size"] == 2


async def test_the_mixture_sends_each_row_to_its_top_two_experts(stack: Stack) -> None:
    x = _x(16, 16, 4)
    want, chosen = moe_reference(x)
    got = await stack.infer("moe", x)
    np.testing.assert_allclose(got["y"], want, rtol=1e-4, atol=1e-5)
    for index, expert in enumerate(MOE[1:]):
        rows = int((chosen == index).any(axis=1).sum())
        activations = stack.metric(
            "inferway_backend_pipeline_expert_activations_total", pipeline="moe", expert=expert.name
        )
        assert activations == rows
    assert (
        sum(
            stack.metric("inferway_backend_pipeline_expert_activations_total", expert=e.name)
            for e in MOE[1:]
        )
        == 16 * 2
    )
    spans = stack.finished()
    experts = [s for s in spans if s.name.startswith("expert ")]
    (mix,) = [s for s in spans if s.name == "step experts"]
    assert experts and all(
        s.parent is not None and s.parent.span_id == mix.context.span_id for s in experts
    )


async def test_cached_steps_answer_repeated_inputs_without_computing(stack: Stack) -> None:
    x = _x(2, 32, 5)
    batches = "inferway_backend_batch_size_count"
    first = await stack.infer("chain", x)
    computed = stack.metric(batches, model="chain_embed")
    again = await stack.infer("chain", x)
    for name in ("left", "right"):
        np.testing.assert_array_equal(first[name], again[name])
    assert stack.metric(batches, model="chain_embed") == computed  # no new batch: a hit
    hits = "inferway_backend_pipeline_cache_requests_total"
    for step in ("embed", "left", "right"):
        assert stack.metric(hits, pipeline="chain", step=step, result="hit") == 1
        assert stack.metric(hits, pipeline="chain", step=step, result="miss") == 1
    await stack.infer("chain", _x(2, 32, 6))  # other inputs: computed
    assert stack.metric(batches, model="chain_embed") == computed + 1
    assert stack.metric("inferway_backend_pipeline_cache_bytes", pipeline="chain") > 0
    spans = [s for s in stack.finished() if s.name == "step embed"]
    assert [s.attributes["inferway.cache"] for s in spans] == ["miss", "hit", "miss"]


async def test_a_bad_edit_is_refused_at_its_line_and_the_old_pipeline_keeps_serving(
    tmp_path: Path,
) -> None:
    path = _write_chain(tmp_path, cache=False)
    async with _stack(tmp_path, watch=True) as stack:
        repository = stack.handle.repository
        good = path.read_text()
        x = _x(1, 32, 7)
        await stack.infer("chain", x)
        path.write_text(good.replace("x: embed.y\n", "x: embed.nope\n", 1))
        await _until(lambda: str(path) in repository.errors)
        message = repository.errors[str(path)]
        line = next(
            i for i, text in enumerate(path.read_text().splitlines(), 1) if "embed.nope" in text
        )
        assert f"{path}:{line}: steps.1.inputs.x: step 'embed' has no output 'nope'" in message
        got = await stack.infer("chain", x)  # the old pipeline still answers
        np.testing.assert_allclose(got["left"], chain_reference(x)["left"], rtol=1e-4, atol=1e-5)
        async with stack.http.post("/v2/repository/index") as r:
            (entry,) = [e for e in await r.json() if e["name"] == "chain"]
        assert entry["state"] == "READY"
        # a fixed file is picked up again; outputs renamed: the new pipeline serves
        path.write_text(good.replace("left: left.y", "l: left.y"))
        await _until(
            lambda: (
                str(path) not in repository.errors
                and "l" in {o.name for o in repository.get("chain").outputs}
            )
        )
        assert set(await stack.infer("chain", x)) == {"l", "right"}


async def test_the_pipeline_is_ready_only_while_its_step_models_serve(tmp_path: Path) -> None:
    path = _write_chain(tmp_path, cache=False)
    async with _stack(tmp_path) as stack:
        repository = stack.handle.repository
        await repository.unload_model("chain_right")
        assert not repository.ready and "chain" in repository.unserved()
        async with stack.http.get("/v2/models/chain/ready") as r:
            assert r.status == 404
        async with stack.http.post("/v2/models/chain/infer", json=_json_request(_x(1, 32, 8))) as r:
            assert r.status == 404
        assert "model 'chain_right' not found" in repository.errors[str(path)]
        await repository.load_model("chain_right")
        assert repository.ready and repository.get("chain").platform == "pipeline"
        await stack.infer("chain", _x(1, 32, 8))


async def test_a_directory_that_is_both_a_model_and_a_pipeline_is_refused(tmp_path: Path) -> None:
    _write_chain(tmp_path, cache=False)
    clash = tmp_path / "chain_embed" / "pipeline.yaml"
    clash.write_text((tmp_path / "chain" / "pipeline.yaml").read_text())
    async with _stack(tmp_path) as stack:
        repository = stack.handle.repository
        assert "holds model versions too" in repository.errors[str(clash)]
        assert repository.get("chain_embed").platform == "onnxruntime"  # the model serves
        assert repository.get("chain").platform == "pipeline"


async def test_a_pipeline_can_be_unloaded_and_loaded_on_request(tmp_path: Path) -> None:
    _write_chain(tmp_path, cache=False)
    async with _stack(tmp_path) as stack:
        async with stack.http.post("/v2/repository/models/chain/unload") as r:
            assert r.status == 200
        async with stack.http.get("/v2/models/chain") as r:
            assert r.status == 404
        assert stack.handle.repository.get("chain_embed")  # its models keep serving
        async with stack.http.post("/v2/repository/models/chain/load") as r:
            assert r.status == 200
        assert (await stack.grpc.ModelReady(pb2.ModelReadyRequest(name="chain"))).ready


async def test_an_asynchronous_job_can_name_a_pipeline(tmp_path: Path) -> None:
    _write_chain(tmp_path, cache=False)
    x = _x(2, 32, 9)
    handle = await start_backend(tmp_path, watch=False, jobs=JobSettings())
    try:
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{handle.http_port}") as s:
            status, doc, _ = await submit(s, "chain", _json_request(x))
            assert status == 202, doc
            done = await wait_for_job(s, doc["id"], {"succeeded", "failed"})
        assert done["status"] == "succeeded", done
        got = _outputs(done["result"])
        np.testing.assert_allclose(got["right"], chain_reference(x)["right"], rtol=1e-4, atol=1e-5)
    finally:
        await handle.stop()


async def test_a_step_naming_another_pipeline_says_so(tmp_path: Path) -> None:
    """Issue 33, item 9: it said "model 'moe' not found" while ``moe`` was served."""
    write_moe_pipeline(tmp_path, config=CPU)
    nested = tmp_path / "outer" / "pipeline.yaml"
    nested.parent.mkdir()
    nested.write_text(
        yaml.safe_dump(
            {
                "steps": [{"name": "inner", "model": "moe", "inputs": {"x": "request.x"}}],
                "outputs": {"y": "inner.y"},
            }
        )
    )
    async with _stack(tmp_path) as stack:
        repository = stack.handle.repository
        assert repository.get("moe").platform == "pipeline"
        error = repository.errors[str(nested)]
        assert "model: 'moe' is a pipeline, not a model" in error
        assert "not found" not in error
