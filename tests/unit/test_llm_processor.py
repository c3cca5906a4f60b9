"""The LLM processor's ext_proc conversation without Envoy (Envoy's side is in
tests/integration/test_llm_gateway.py): the messages it answers with for a stream whose
client did not ask for usage, the 429 once a client's tokens are used up, and the gen_ai span
it records."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from google.protobuf import struct_pb2
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from inferway._xds_protos.envoy.config.core.v3 import base_pb2
from inferway._xds_protos.envoy.service.ext_proc.v3 import external_processor_pb2 as ep_pb2
from inferway.gateway.llm.exchange import LlmSettings
from inferway.gateway.llm.limits import LimitSpec, MemoryBudgetStore, TokenBudget
from inferway.gateway.llm.metrics import LlmMetrics
from inferway.gateway.llm.processor import LlmProcessor


def _headers(pairs: dict[str, str], end: bool = False) -> ep_pb2.HttpHeaders:
    return ep_pb2.HttpHeaders(
        headers=base_pb2.HeaderMap(
            headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
        ),
        end_of_stream=end,
    )


def _conversation(body: dict[str, object], answer: list[bytes]) -> list[ep_pb2.ProcessingRequest]:
    attributes = struct_pb2.Struct()
    attributes.update({"xds.route_name": "r", "xds.cluster_name": "svc"})
    messages = [
        ep_pb2.ProcessingRequest(
            request_headers=_headers({":path": "/v1/chat/completions", "x-api-key": "sk-1"})
        ),
        ep_pb2.ProcessingRequest(
            request_body=ep_pb2.HttpBody(body=json.dumps(body).encode(), end_of_stream=True)
        ),
        ep_pb2.ProcessingRequest(
            response_headers=_headers({":status": "200", "content-type": "text/event-stream"}),
            attributes={"envoy.filters.http.ext_proc": attributes},
        ),
    ]
    for i, chunk in enumerate(answer):
        end = i == len(answer) - 1
        messages.append(
            ep_pb2.ProcessingRequest(response_body=ep_pb2.HttpBody(body=chunk, end_of_stream=end))
        )
    return messages


async def _run(
    processor: LlmProcessor, messages: list[ep_pb2.ProcessingRequest]
) -> list[ep_pb2.ProcessingResponse]:
    async def requests() -> AsyncIterator[ep_pb2.ProcessingRequest]:
        for message in messages:
            yield message

    class Context:
        def invocation_metadata(self) -> tuple[()]:
            return ()

    return [answer async for answer in processor.Process(requests(), Context())]


CHUNKS = [
    b'data: {"model":"m","choices":[{"delta":{"content":"a"}}]}\n\ndata: {"model":"m","cho',
    b'ices":[{"delta":{"content":"b"}}]}\n\n',
    b'data: {"model":"m","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2}}\n\n'
    b"data: [DONE]\n\n",
]


def test_a_stream_is_routed_rewritten_counted_and_traced_then_limited() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    registry = CollectorRegistry()
    budget = TokenBudget([LimitSpec("tokens_per_minute", 5)], MemoryBudgetStore())
    settings = LlmSettings(models={"alias": "m", "m": "m"}, routes={"m": "r"}, budget=budget)
    processor = LlmProcessor(LlmMetrics(registry), settings, tracer=provider.get_tracer("test"))
    body = {"model": "alias", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    answers = asyncio.run(_run(processor, _conversation(body, CHUNKS)))

    routed = answers[1].request_body.response
    assert (
        answers[1].dynamic_metadata.fields["inferway.llm"].struct_value.fields["model"].string_value
        == "m"
    )
    assert routed.clear_route_cache
    sent = json.loads(routed.body_mutation.body)
    assert sent["model"] == "m" and sent["stream_options"] == {"include_usage": True}
    assert "content-length" in answers[0].request_headers.response.header_mutation.remove_headers
    passed = b"".join(a.response_body.response.body_mutation.body for a in answers[3:])
    assert passed == (
        b'data: {"model":"m","choices":[{"delta":{"content":"a"}}]}\n\n'
        b'data: {"model":"m","choices":[{"delta":{"content":"b"}}]}\n\n'
        b"data: [DONE]\n\n"
    ), "the usage chunk the gateway asked for never reaches the client"
    labels = {"route": "r", "model": "m", "backend": "svc", "estimated": "false"}
    tokens = "inferway_llm_tokens_total"
    assert (
        registry.get_sample_value(tokens, {**labels, "client": _client(registry), "type": "input"})
        == 4
    )
    (span,) = exporter.get_finished_spans()
    assert span.name == "chat m" and span.attributes is not None
    assert span.attributes["gen_ai.request.model"] == "alias"
    assert (
        span.attributes["gen_ai.usage.input_tokens"],
        span.attributes["gen_ai.usage.output_tokens"],
    ) == (4, 2)

    refused = asyncio.run(_run(processor, _conversation(body, CHUNKS)))  # 6 of 5 tokens used
    (answer,) = refused
    immediate = answer.immediate_response
    assert immediate.status.code == 429
    headers = {h.header.key: h.header.raw_value for h in immediate.headers.set_headers}
    assert int(headers["retry-after"]) >= 1
    assert json.loads(immediate.body)["error"]["code"] == "tokens_per_minute"
    limited = "inferway_llm_limited_requests_total"
    client = _client(registry)
    assert registry.get_sample_value(limited, {"client": client, "limit": "tokens_per_minute"}) == 1


def _client(registry: CollectorRegistry) -> str:
    for metric in registry.collect():
        for sample in metric.samples:
            if "client" in sample.labels:
                return sample.labels["client"]
    raise AssertionError("no client label recorded")


def test_requests_it_cannot_serve_are_answered_with_a_reason() -> None:
    processor = LlmProcessor(LlmMetrics(CollectorRegistry()), LlmSettings(models={"m": "m"}))
    path = {":path": "/v1/chat/completions"}
    (bodyless,) = asyncio.run(
        _run(processor, [ep_pb2.ProcessingRequest(request_headers=_headers(path, end=True))])
    )
    assert bodyless.immediate_response.status.code == 400
    for body, status, code in (
        (b"{", 400, "invalid_json"),
        (b'{"model": "x"}', 404, "model_not_found"),
    ):
        messages = [
            ep_pb2.ProcessingRequest(request_headers=_headers(path)),
            ep_pb2.ProcessingRequest(request_body=ep_pb2.HttpBody(body=body, end_of_stream=True)),
        ]
        _, answer = asyncio.run(_run(processor, messages))
        assert answer.immediate_response.status.code == status
        assert json.loads(answer.immediate_response.body)["error"]["code"] == code
    assert processor.errors == 0


def test_a_stream_read_by_envoy_is_recorded_from_the_filter_report() -> None:
    """Envoy's Lua filter reports a stream's end while the ext_proc stream is still open:
    the request is recorded from it (usage, TTFT from the filter's wall-clock microseconds,
    route and backend), once; Envoy closing the stream afterwards records nothing more."""
    registry = CollectorRegistry()
    processor = LlmProcessor(LlmMetrics(registry), LlmSettings(models={"m": "m"}))
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    messages = _conversation(body, [])[:2]

    async def scenario() -> list[ep_pb2.ProcessingResponse]:
        reported = asyncio.Event()

        async def requests() -> AsyncIterator[ep_pb2.ProcessingRequest]:
            for message in messages:
                yield message
            await reported.wait()  # Envoy keeps the stream open until the request ends

        async def run() -> list[ep_pb2.ProcessingResponse]:
            return [a async for a in processor.Process(requests(), None)]

        task = asyncio.create_task(run())
        while not processor._open:
            await asyncio.sleep(0)
        ((stream_id, (stream, _)),) = processor._open.items()
        first_us = int((stream.wall_started + 0.25) * 1e6)
        report = {
            "id": stream_id, "final": True, "status": 200, "route": "r", "backend": "svc",
            "sse": True, "chunks": 2, "first": first_us, "last": first_us + 50_000,
            "prompt": 4, "completion": 2, "model": "m", "done": True, "overflow": False,
        }  # fmt: skip
        await processor.report(json.dumps(report).encode() + b"\n")
        reported.set()
        return await task

    answers = asyncio.run(scenario())
    metadata = answers[1].dynamic_metadata.fields["inferway.llm"].struct_value.fields
    assert metadata["drop_usage"].bool_value and metadata["id"].string_value
    labels = {"route": "r", "model": "m", "backend": "svc", "client": _client(registry)}
    tokens = "inferway_llm_tokens_total"
    assert (
        registry.get_sample_value(tokens, {**labels, "type": "output", "estimated": "false"}) == 2
    )
    requests_total = "inferway_llm_requests_total"
    assert (
        registry.get_sample_value(requests_total, {**labels, "stream": "true", "code": "200"}) == 1
    )
    ttft = "gen_ai_server_time_to_first_token_seconds_sum"
    got = registry.get_sample_value(ttft, {"route": "r", "model": "m", "backend": "svc"})
    assert got is not None and abs(got - 0.25) < 0.01
    assert processor.answer_messages == 0 and not processor._open
