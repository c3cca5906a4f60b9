"""Tracing through a real Envoy into a real backend, received by inferway's OTLP receiver.

One client request gives an Envoy span and a backend request span in the same trace (the
backend span a child of Envoy's), and a batch span linked to the request span; x-request-id
is the same at the client, on Envoy's span and on the backend's. 0% sampling exports nothing.
"""

from __future__ import annotations

import asyncio

import grpc
import httpx
import numpy as np
import pytest

from inferway.backends.protocol import pb2, pb2_grpc
from inferway.devtools.otlp_receiver import ReceivedSpan
from inferway.devtools.trace_tree import build_trace_tree, find_trace_id
from tests.observability_stack import BACKEND_SERVICE, FEATURES, GATEWAY_SERVICE, traced_stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def _by_service(spans: list[ReceivedSpan], trace_id: str, service: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.trace_id == trace_id and s.service == service]


def _complete(trace_id: str):
    """A trace is complete once it has Envoy's span, the backend's span and a linked batch."""

    def check(spans: list[ReceivedSpan]) -> bool:
        envoy = _by_service(spans, trace_id, GATEWAY_SERVICE)
        backend = [s for s in _by_service(spans, trace_id, BACKEND_SERVICE) if s.kind == "server"]
        linked = {sid for s in spans for t, sid in s.links if t == trace_id}
        return bool(envoy and backend and any(b.span_id in linked for b in backend))

    return check


async def test_one_request_is_one_trace_envoy_to_backend_to_batch(tmp_path) -> None:
    async with traced_stack(tmp_path, sampling_percent=100) as stack:
        async with httpx.AsyncClient(timeout=10, trust_env=False) as client:
            response = await stack.post_infer(client)
        assert response.status_code == 200, response.text
        request_id = response.headers["x-request-id"]

        spans = await stack.flush_and_wait(lambda s: find_trace_id(s, request_id) is not None)
        trace_id = find_trace_id(spans, request_id)
        assert trace_id is not None
        spans = await stack.flush_and_wait(_complete(trace_id))

        (envoy,) = _by_service(spans, trace_id, GATEWAY_SERVICE)
        (server,) = [s for s in _by_service(spans, trace_id, BACKEND_SERVICE) if s.kind == "server"]
        assert envoy.parent_span_id == ""  # the client sent no traceparent: Envoy starts it
        assert server.parent_span_id == envoy.span_id  # W3C traceparent carried upstream
        assert envoy.attributes.get("request_id") == request_id
        assert server.attributes.get("request_id") == request_id
        assert server.attributes.get("inferway.model_version") == "1"
        (batch,) = [s for s in spans if (trace_id, server.span_id) in s.links]
        assert batch.name.startswith("batch demo") and batch.trace_id != trace_id
        assert batch.attributes["batch.requests"] >= 1
        assert server.start_ns <= batch.start_ns and batch.end_ns <= server.end_ns

        roots = build_trace_tree(spans, trace_id)
        assert [r.span.span_id for r in roots] == [envoy.span_id]
        (child,) = roots[0].children
        assert child.span.span_id == server.span_id
        assert [(n.span.span_id, n.linked) for n in child.children] == [(batch.span_id, True)]


async def test_full_sampling_traces_every_request_and_batches_link_each(tmp_path) -> None:
    async with traced_stack(tmp_path, sampling_percent=100) as stack:
        limits = httpx.Limits(max_connections=8)
        async with httpx.AsyncClient(timeout=10, trust_env=False, limits=limits) as client:
            responses = await asyncio.gather(*(stack.post_infer(client) for _ in range(12)))
        assert all(r.status_code == 200 for r in responses)
        request_ids = [r.headers["x-request-id"] for r in responses]
        assert len(set(request_ids)) == 12

        # gRPC through Envoy (HTTP/2 route to the backend's gRPC port) is traced the same way.
        async with grpc.aio.insecure_channel(stack.grpc_target) as channel:
            stub = pb2_grpc.GRPCInferenceServiceStub(channel)
            request = pb2.ModelInferRequest(model_name="demo")
            request.inputs.add(name="x", datatype="FP32", shape=[1, FEATURES])
            request.raw_input_contents.append(np.ones((1, FEATURES), np.float32).tobytes())
            call = stub.ModelInfer(request)
            await call
            grpc_request_id = dict(await call.initial_metadata()).get("x-request-id")
        assert grpc_request_id

        def all_traced(spans: list[ReceivedSpan]) -> bool:
            ids = [find_trace_id(spans, rid) for rid in [*request_ids, grpc_request_id]]
            return all(t is not None and _complete(t)(spans) for t in ids)

        spans = await stack.flush_and_wait(all_traced, timeout=15)
        trace_ids = {find_trace_id(spans, rid) for rid in request_ids}
        assert len(trace_ids) == 12  # one trace per request
        grpc_trace = find_trace_id(spans, grpc_request_id)
        (grpc_server,) = [
            s
            for s in _by_service(spans, grpc_trace, BACKEND_SERVICE)  # type: ignore[arg-type]
            if s.kind == "server"
        ]
        assert grpc_server.attributes.get("rpc.system") == "grpc"
        (grpc_envoy,) = _by_service(spans, grpc_trace, GATEWAY_SERVICE)  # type: ignore[arg-type]
        assert grpc_server.parent_span_id == grpc_envoy.span_id


async def test_zero_sampling_sends_no_spans(tmp_path) -> None:
    async with traced_stack(tmp_path, sampling_percent=0) as stack:
        async with httpx.AsyncClient(timeout=10, trust_env=False) as client:
            responses = [await stack.post_infer(client) for _ in range(8)]
        assert all(r.status_code == 200 for r in responses)
        assert all(r.headers.get("x-request-id") for r in responses)
        # Bounded wait: Envoy flushes every 100 ms here; the backend is flushed explicitly.
        with pytest.raises(TimeoutError):
            await stack.flush_and_wait(lambda spans: len(spans) > 0, timeout=1.5)
        assert stack.receiver.spans() == []
