"""OpenAI-compatible routes through real Envoy, the real LLM processor (Envoy's external
processor in the gateway) and OpenAI-style engines: the body's model (or an alias) picks the
backend, streams pass through with usage counted equal to the engine's own (asked for when
the client did not, and then kept from it), plain answers are counted from their usage, a
1 MB prompt arrives intact, a token-per-minute limit answers 429 with Retry-After, and a
replica's 429 falls back to another replica before anything is streamed."""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

import httpx
import pytest

from inferway.gateway.llm.processor import REPORT_GRACE_S
from tests.envoy_process import with_llm_ports
from tests.openai_fake import FakeOpenAI
from tests.traffic_harness import TrafficGateway, poll_until

pytestmark = pytest.mark.asyncio

POLICY = """
version: 1
listeners:
  - name: ingress
    port: {listener_port}
llm:
  port: LLM_PORT
  reports_port: LLM_REPORTS_PORT
  timeout: 10s
services:
  - name: llama-pool
    endpoints: ["127.0.0.1:{llama}", "127.0.0.1:{llama2}"]
  - name: qwen-pool
    endpoints: ["127.0.0.1:{qwen}"]
routes:
  - name: llama
    openai:
      model: tiny-llama
      aliases: [gpt-4o-mini]
      ask_for_usage: false  # as for an engine that refuses stream_options
    backends:
      - service: llama-pool
  - name: qwen
    openai:
      model: qwen
    backends:
      - service: qwen-pool
"""
LIMITED = POLICY.replace(
    "  timeout: 10s\n", "  timeout: 10s\n  limits:\n    tokens_per_minute: 40\n"
)
CHAT = "/v1/chat/completions"


def chat(model: str, *, stream: bool = False, usage: bool = False, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "one two three four five"}],
        "max_tokens": 6,
        **extra,
    }
    if stream:
        body["stream"] = True
    if usage:
        body["stream_options"] = {"include_usage": True}
    return body


async def post(
    gw: TrafficGateway, body: dict[str, Any] | bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    assert gw.session is not None
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    all_headers = {"content-type": "application/json", **(headers or {})}
    async with gw.session.post(gw.url + CHAT, data=data, headers=all_headers) as response:
        raw = await response.read()
        return response.status, {k.lower(): v for k, v in response.headers.items()}, raw


def events(raw: bytes) -> list[Any]:
    out = []
    for block in raw.decode().split("\n\n"):
        if block.startswith("data: ") and block != "data: [DONE]":
            out.append(json.loads(block[6:]))
    return out


def sample(gw: TrafficGateway, name: str, **labels: str) -> float:
    assert gw.gateway is not None and gw.gateway.llm is not None
    registry = gw.gateway.llm.processor.metrics.registry  # the gateway's /metrics
    value = 0.0
    for metric in registry.collect():
        for s in metric.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                value += s.value
    return value


def engines() -> list[FakeOpenAI]:
    return [FakeOpenAI("llama"), FakeOpenAI("llama2"), FakeOpenAI("qwen")]


def on_transport(policy: str, transport: str, reader: str = "auto") -> str:
    settings = f"  timeout: 10s\n  transport: {transport}\n  stream_reader: {reader}\n"
    return policy.replace("  timeout: 10s\n", settings)


@pytest.fixture(params=["http", "http-lua", "ext_proc"])
async def gateway(request: pytest.FixtureRequest) -> Any:
    """Both ways Envoy asks the processor: the Lua filter over HTTP (the default) and
    Envoy's external processing filter over gRPC; over HTTP, streams read by inferway's
    native module (the default where it builds) or by the Lua filter (``http-lua``)."""
    transport, _, reader = request.param.partition("-")
    policy = on_transport(POLICY, transport, reader or "auto")
    async with TrafficGateway(with_llm_ports(policy), engines()) as gw:
        gw.transport = transport  # type: ignore[attr-defined]
        yield gw


async def test_the_body_model_or_an_alias_picks_the_backend(gateway: TrafficGateway) -> None:
    gw = gateway
    for model, pool in (
        ("tiny-llama", "llama-pool"),
        ("gpt-4o-mini", "llama-pool"),
        ("qwen", "qwen-pool"),
    ):
        status, headers, raw = await post(gw, chat(model))
        assert (status, headers["x-inferway-pool"]) == (200, pool), raw
    sent = json.loads(gw.backends["llama"].bodies[-1] or gw.backends["llama2"].bodies[-1])
    assert sent["model"] == "tiny-llama", "the alias reaches the engine as the served name"
    status, _, raw = await post(gw, chat("gpt-5"))
    assert status == 404 and json.loads(raw)["error"]["code"] == "model_not_found"
    assert gw.session is not None
    async with gw.session.get(gw.url + "/v1/models") as response:
        listed = {m["id"] for m in (await response.json())["data"]}
    assert listed == {"tiny-llama", "gpt-4o-mini", "qwen"}


async def test_a_request_outside_the_openai_prefix_is_not_the_processors(
    gateway: TrafficGateway,
) -> None:
    """Envoy's own 404 for a path no route serves, not the processor's 400 (missing body or
    model): the processor lets such a request go at its headers."""
    gw = gateway
    assert gw.session is not None and gw.gateway is not None and gw.gateway.llm is not None
    processor = gw.gateway.llm.processor
    before = processor.foreign
    async with gw.session.get(gw.url + "/nope") as response:
        assert response.status == 404, await response.text()
    async with gw.session.post(gw.url + "/v1beta/chat", json={}) as response:
        assert response.status == 404, await response.text()
    assert processor.foreign == before + 2
    async with gw.session.get(gw.url + "/v1/models") as response:  # still the OpenAI prefix
        assert response.status == 200


async def test_a_stream_is_counted_from_usage_the_client_did_not_ask_for(
    gateway: TrafficGateway,
) -> None:
    gw = gateway
    status, headers, raw = await post(gw, chat("qwen", stream=True), {"x-api-key": "sk-a"})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    got = events(raw)
    assert all(not e.get("usage") for e in got), "the client never asked: no usage chunk"
    assert "".join(e["choices"][0]["delta"]["content"] for e in got) == "t0 t1 t2 t3 t4 t5 "
    assert raw.endswith(b"data: [DONE]\n\n")
    engine = gw.backends["qwen"]
    assert json.loads(engine.bodies[-1])["stream_options"] == {"include_usage": True}
    prompt, completion = engine.usages[-1]
    labels = {"route": "qwen", "model": "qwen", "backend": "qwen-pool", "estimated": "false"}
    assert sample(gw, "inferway_llm_tokens_total", type="input", **labels) == prompt
    assert sample(gw, "inferway_llm_tokens_total", type="output", **labels) == completion
    assert sample(gw, "inferway_llm_requests_total", stream="true", code="200") == 1
    assert sample(gw, "gen_ai_server_time_to_first_token_seconds_count", route="qwen") == 1
    assert sample(gw, "gen_ai_client_token_usage_sum", gen_ai_token_type="output") == completion
    assert gw.gateway is not None and gw.gateway.admin is not None
    async with httpx.AsyncClient() as admin:  # the gateway's admin /metrics serves them
        text = (await admin.get(gw.gateway.admin.url + "/metrics")).text
    for name in (
        "inferway_llm_tokens_total{",
        "inferway_llm_requests_total{",
        "gen_ai_client_token_usage_bucket{",
        "gen_ai_server_time_to_first_token_seconds_bucket{",
        "gen_ai_server_time_per_output_token_seconds_bucket{",
    ):
        assert name in text, name


async def test_a_client_that_asked_for_usage_gets_it_and_plain_answers_count_too(
    gateway: TrafficGateway,
) -> None:
    gw = gateway
    status, _, raw = await post(gw, chat("qwen", stream=True, usage=True))
    assert status == 200
    last = events(raw)[-1]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 6
    status, _, raw = await post(gw, chat("qwen", max_tokens=3))
    assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 3
    labels = {"route": "qwen", "type": "output", "estimated": "false"}
    assert sample(gw, "inferway_llm_tokens_total", **labels) == 9
    assert sample(gw, "inferway_llm_requests_total", stream="false", code="200") == 1


def sized_body(size: int, *, stream: bool) -> bytes:
    """A chat request of exactly ``size`` bytes (its prompt padded with words)."""
    head = json.dumps(chat("qwen", stream=stream, messages=[{"role": "user", "content": ""}]))
    room = size - len(head.encode())
    words = " ".join(f"w{i % 1000:03d}" for i in range(room // 5 + 1))[:room].rstrip()
    body = json.dumps(chat("qwen", stream=stream, messages=[{"role": "user", "content": words}]))
    return body.encode() + b" " * (size - len(body.encode()))  # JSON allows trailing spaces


async def test_one_megabyte_prompts_arrive_intact_around_envoys_buffer_size(
    gateway: TrafficGateway,
) -> None:
    """Envoy 1.35-1.37 duplicated the end of stream of ext_proc bodies near 1 MiB: sizes
    just below, at and above it, untouched (bytes equal) and rewritten (prompt equal)."""
    gw = gateway
    engine = gw.backends["qwen"]
    mib = 1024 * 1024
    for size in (mib - 1, mib, mib + 1, mib + 100_000, 6 * mib):  # gRPC's default cap: 4 MiB
        body = sized_body(size, stream=False)
        assert len(body) == size
        status, _, raw = await post(gw, body)  # nothing to rewrite: the bytes pass untouched
        assert status == 200, (size, raw[:200])
        assert hashlib.sha256(engine.bodies[-1]).digest() == hashlib.sha256(body).digest(), size
        streamed = sized_body(size, stream=True)
        status, _, raw = await post(gw, streamed)  # rewritten (include_usage) on the way
        assert status == 200 and raw.endswith(b"data: [DONE]\n\n"), size
        sent = json.loads(engine.bodies[-1])
        assert sent["messages"] == json.loads(streamed)["messages"], size
        assert sent["stream_options"] == {"include_usage": True}
    assert len(engine.bodies) == 10, "each request reached the engine exactly once"


async def test_a_stream_longer_than_the_report_grace_is_recorded_from_its_final_report() -> None:
    """The processor takes the ext_proc stream's end as the request's end only after
    ``REPORT_GRACE_S``; a stream that outlasts that must still be recorded from the Lua
    filter's final report (the engine's usage), not early and estimated. (Envoy's
    ``FULL_DUPLEX_STREAMED`` body mode ends the ext_proc stream once the body has passed: a
    trial of it recorded this stream as 30 estimated input tokens and 1 output.)"""
    slow = FakeOpenAI("qwen", token_delay=0.3)  # 6 tokens: about 1.8 s
    assert 6 * slow.token_delay > REPORT_GRACE_S
    async with TrafficGateway(
        with_llm_ports(POLICY), [FakeOpenAI("llama"), FakeOpenAI("llama2"), slow]
    ) as gw:
        status, _, raw = await post(gw, chat("qwen", stream=True, max_tokens=6))
        assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
        labels = {"route": "qwen", "model": "qwen", "backend": "qwen-pool", "estimated": "false"}
        tokens = "inferway_llm_tokens_total"
        assert sample(gw, tokens, type="output", **labels) == 6
        assert sample(gw, tokens, type="input", estimated="true") == 0


async def test_a_body_over_max_body_bytes_gets_413_and_reaches_no_engine() -> None:
    """Envoy holds the whole body for the processor (``BUFFERED``) in a buffer of
    ``llm.max_body_bytes``: one byte more is refused with 413 before the processor or any
    engine sees it; one at the limit passes."""
    mib = 1024 * 1024
    policy = with_llm_ports(
        POLICY.replace("  timeout: 10s\n", f"  timeout: 10s\n  max_body_bytes: {mib}\n")
    )
    async with TrafficGateway(policy, engines()) as gw:
        status, _, raw = await post(gw, sized_body(mib + 1, stream=False))
        assert status == 413, raw[:200]
        assert gw.backends["qwen"].bodies == []
        status, _, raw = await post(gw, sized_body(mib, stream=False))
        assert status == 200, raw[:200]
        assert len(gw.backends["qwen"].bodies) == 1


async def test_a_token_per_minute_limit_answers_429_with_retry_after() -> None:
    policy = with_llm_ports(LIMITED)
    async with TrafficGateway(policy, engines()) as gw:
        key = {"x-api-key": "sk-limited"}
        status, _, _ = await post(gw, chat("qwen", max_tokens=30), key)  # 5 + 30 tokens
        assert status == 200
        status, _, _ = await post(gw, chat("qwen", max_tokens=30), key)  # 35 < 40: overshoots
        assert status == 200
        served = len(gw.backends["qwen"].bodies)
        status, headers, raw = await post(gw, chat("qwen"), key)
        assert status == 429
        assert 1 <= int(headers["retry-after"]) <= 60
        error = json.loads(raw)["error"]
        assert error["code"] == "tokens_per_minute" and error["limit_tokens"] == 40
        assert "tokens_per_minute" in error["message"]
        assert len(gw.backends["qwen"].bodies) == served, "refused before any engine"
        status, _, _ = await post(gw, chat("qwen"), {"x-api-key": "sk-other"})
        assert status == 200, "another client key has its own budget"


async def test_a_replica_answering_429_falls_back_to_another(gateway: TrafficGateway) -> None:
    gw = gateway
    gw.backends["llama"].status = 429
    for stream in (False, True, False, True):
        status, headers, raw = await post(gw, chat("tiny-llama", stream=stream))
        assert status == 200, raw
        assert headers["x-inferway-replica"].endswith(f":{gw.backends['llama2'].port}")
    assert sample(gw, "inferway_llm_requests_total", route="llama", code="200") == 4
    assert sample(gw, "inferway_llm_requests_total", route="llama", code="429") == 0
    assert gw.backends["llama"].bodies, "the refusing replica was tried (and fallen back from)"


async def test_streams_pass_chunk_by_chunk_not_buffered() -> None:
    slow = FakeOpenAI("qwen", token_delay=0.3)
    policy = with_llm_ports(POLICY)
    async with TrafficGateway(policy, [FakeOpenAI("llama"), FakeOpenAI("llama2"), slow]) as gw:
        assert gw.session is not None
        body = json.dumps(chat("qwen", stream=True, max_tokens=4)).encode()
        arrivals: list[bytes] = []
        async with gw.session.post(
            gw.url + CHAT, data=body, headers={"content-type": "application/json"}
        ) as response:
            async for piece in response.content.iter_any():
                arrivals.append(piece)
                if len(arrivals) == 1:
                    first = b"".join(arrivals)
        assert b"t0" in first and b"t3" not in first, "the first token came before the last"
        assert len(arrivals) >= 4


async def test_client_keys_are_hashed_in_labels(gateway: TrafficGateway) -> None:
    gw = gateway
    await post(gw, chat("qwen"), {"authorization": "Bearer sk-very-secret"})
    assert gw.gateway is not None and gw.gateway.llm is not None
    rendered = gw.gateway.llm.processor.metrics.tokens.collect()
    clients = {s.labels["client"] for m in rendered for s in m.samples}
    assert clients and all(c.startswith("key-") for c in clients)
    assert not any("secret" in c for c in clients)


@pytest.mark.parametrize("reader", ["auto", "lua"])
async def test_a_client_gone_mid_stream_is_counted_as_estimated(reader: str) -> None:
    slow = FakeOpenAI("qwen", token_delay=0.2)
    policy = with_llm_ports(on_transport(POLICY, "http", reader))
    async with TrafficGateway(policy, [FakeOpenAI("llama"), FakeOpenAI("llama2"), slow]) as gw:
        assert gw.session is not None
        body = json.dumps(chat("qwen", stream=True, max_tokens=50)).encode()
        response = await gw.session.post(
            gw.url + CHAT, data=body, headers={"content-type": "application/json"}
        )
        first = await response.content.readany()
        assert b"t0" in first
        response.close()  # the client goes away after its first token

        async def recorded() -> bool:
            return sample(gw, "inferway_llm_requests_total", route="qwen") == 1

        await poll_until(recorded, timeout=10, what="the abandoned stream recorded")
        output = sample(gw, "inferway_llm_tokens_total", type="output", estimated="true")
        assert 1 <= output < 50, output


async def test_a_client_gone_before_its_answer_began_is_recorded_once() -> None:
    """No answer ever reached Envoy's filter: Envoy's access log (``transport: http``) tells
    the processor the request is over; it is recorded once, with no status, its prompt
    estimated."""
    slow = FakeOpenAI("qwen", answer_delay=1.0)
    policy = with_llm_ports(POLICY)
    async with TrafficGateway(policy, [FakeOpenAI("llama"), FakeOpenAI("llama2"), slow]) as gw:
        assert gw.gateway is not None and gw.gateway.llm is not None
        body = json.dumps(chat("qwen", stream=True)).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.listener_port)
        head = (
            f"POST {CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        )
        writer.write(head.encode() + body)
        await poll_until(lambda: bool(slow.bodies), timeout=10, what="the engine asked")
        writer.close()  # before any answer

        async def recorded() -> bool:
            return sample(gw, "inferway_llm_requests_total", route="qwen", code="0") == 1

        await poll_until(recorded, timeout=10, what="the abandoned request recorded")
        assert sample(gw, "inferway_llm_tokens_total", type="input", estimated="true") > 0
        await asyncio.sleep(1.5)  # the engine's late answer finds nobody: nothing more
        assert sample(gw, "inferway_llm_requests_total") == 1
        assert gw.gateway.llm.server is not None and gw.gateway.llm.server.closed_by_log == 1
        del reader


async def test_completions_and_embeddings_are_routed_and_counted(gateway: TrafficGateway) -> None:
    gw = gateway
    assert gw.session is not None
    engine = gw.backends["qwen"]
    for path, body in (
        ("/v1/completions", {"model": "qwen", "prompt": "a b c", "max_tokens": 2}),
        ("/v1/embeddings", {"model": "qwen", "input": "a b c d"}),
    ):
        async with gw.session.post(gw.url + path, json=body) as response:
            assert response.status == 200, await response.text()
    assert engine.usages[-2:] == [(3, 2), (4, 0)]
    assert sample(gw, "inferway_llm_tokens_total", route="qwen", type="input") == 7
    assert sample(gw, "inferway_llm_tokens_total", route="qwen", type="output") == 2
    usage = "gen_ai_client_token_usage_sum"
    assert sample(gw, usage, gen_ai_operation_name="embeddings", gen_ai_token_type="input") == 4
    assert sample(gw, usage, gen_ai_operation_name="text_completion") == 5


async def test_a_route_that_does_not_ask_for_usage_counts_streams_by_chunks(
    gateway: TrafficGateway,
) -> None:
    gw = gateway
    status, _, raw = await post(gw, chat("tiny-llama", stream=True, max_tokens=5))
    assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
    engine = next(e for e in (gw.backends["llama"], gw.backends["llama2"]) if e.bodies)
    assert "stream_options" not in json.loads(engine.bodies[-1]), "the body went untouched"
    labels = {"route": "llama", "type": "output"}
    assert sample(gw, "inferway_llm_tokens_total", estimated="true", **labels) == 5


@pytest.mark.parametrize("transport", ["http", "ext_proc"])
async def test_with_the_processor_down_limited_openai_routes_fail_closed(transport: str) -> None:
    policy = with_llm_ports(on_transport(LIMITED, transport))
    async with TrafficGateway(policy, engines()) as gw:
        assert gw.gateway is not None and gw.gateway.llm is not None
        assert gw.gateway.llm.server is not None
        await gw.gateway.llm.server.stop()
        status, _, raw = await post(gw, chat("qwen"), {"x-api-key": "sk-a"})
        if transport == "http":
            assert status == 503, "no request slips past the token limits"
            assert json.loads(raw)["error"]["code"] == "llm_processor_unavailable"
        else:  # Envoy's ext_proc filter, failing closed
            assert status == 500, "no request slips past the token limits"
        assert not gw.backends["qwen"].bodies


async def test_without_limits_envoy_admits_plain_requests_itself_even_with_the_processor_down(
    gateway: TrafficGateway,
) -> None:
    """``transport: http`` and no token limits: Envoy's Lua filter routes and rewrites plain
    bodies itself and only tells the processor, so they are served while it is down (not
    counted then); a body it leaves to the processor fails closed."""
    gw = gateway
    assert gw.gateway is not None and gw.gateway.llm is not None
    assert gw.gateway.llm.server is not None
    await gw.gateway.llm.server.stop()
    status, _, raw = await post(gw, chat("gpt-4o-mini", stream=True))
    if gw.transport == "ext_proc":  # type: ignore[attr-defined]
        assert status == 500 and not gw.backends["llama"].bodies + gw.backends["llama2"].bodies
        return
    assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
    served = gw.backends["llama"].bodies + gw.backends["llama2"].bodies
    assert json.loads(served[-1])["model"] == "tiny-llama", "the alias rewritten in Envoy"
    # a stream_options to merge is the processor's to do: fails closed while it is down
    options = chat("qwen", stream=True, stream_options={"continuous_usage_stats": True})
    status, _, raw = await post(gw, options)
    assert status == 503 and json.loads(raw)["error"]["code"] == "llm_processor_unavailable"
    assert not gw.backends["qwen"].bodies


async def test_answers_pass_without_waiting_on_the_processor_per_chunk(
    gateway: TrafficGateway,
) -> None:
    """Envoy's Lua filter reads the answers; the processor hears once per answer (plus a
    progress report per stream), never per chunk, and the client that asked for usage gets
    its chunk."""
    gw = gateway
    assert gw.gateway is not None and gw.gateway.llm is not None
    processor = gw.gateway.llm.processor
    status, _, raw = await post(gw, chat("qwen", stream=True, usage=True, max_tokens=20))
    assert status == 200
    got = events(raw)
    assert len(got) == 21 and got[-1]["usage"]["completion_tokens"] == 20
    status, _, _ = await post(gw, chat("qwen"))
    assert status == 200
    assert processor.answer_messages == 0, "no ext_proc message about an answer"
    if gw.transport == "http":  # type: ignore[attr-defined]
        # each answer's end; the stream's progress stays in Envoy (its request's metadata)
        assert processor.reports == 2, processor.reports
    else:  # the stream: its first token, maybe its 17th, its end; the plain answer: its end
        assert 2 <= processor.reports <= 4, processor.reports
    assert sample(gw, "inferway_llm_tokens_total", route="qwen", type="output") == 26
    assert sample(gw, "gen_ai_server_time_to_first_token_seconds_count", route="qwen") == 1


TRICKY_BODIES = [
    # (body, status, pool, admitted by Envoy itself)
    (
        b'{"messages":[{"role":"user","content":"\\"model\\": \\"qwen\\""}],'
        b'"model":"tiny-llama","max_tokens":2}',
        200,
        "llama-pool",
        True,
    ),
    (b'{"\\u006dodel":"qwen","max_tokens":2}', 200, "qwen-pool", False),  # an escaped key
    (b'{"model":"tiny-llama","model":"qwen","max_tokens":2}', 200, "qwen-pool", False),
    (b'{"model":"qwen","max_tokens":2,}', 400, "", False),  # not JSON: the processor says so
    (b'{"model":"qwen","max_tokens":2}  x', 400, "", False),
    (b'["model","qwen"]', 400, "", False),
    (b'{"model":"nobody","max_tokens":2}', 404, "", False),
    (b'{"model":["qwen"],"n":{"a":[1,{"b":"}"}]}}', 400, "", False),
    (b'{"model":"qwen","x":"a\\qb"}', 400, "", False),  # an escape JSON does not have
    (b'{"model":"qwen","x":"a\nb"}', 400, "", False),  # a raw newline in a string
    (b'{"model":"qwen","x":"\\u12g4"}', 400, "", False),  # a \u without four hex digits
    (b'{"model":"qwen","x":"\\u00e9\\u00E9","max_tokens":2}', 200, "qwen-pool", True),
    (
        b'{"model" : "qwen" , "stream" : true , "stream_options" : {"include_usage" : true}}',
        200,
        "qwen-pool",
        True,
    ),
    (
        b'{"model":"qwen","stream":true,"stream_options":{"include_usage":false}}',
        200,
        "qwen-pool",
        False,
    ),  # to merge: the processor
]


@pytest.mark.parametrize(("body", "status", "pool", "local"), TRICKY_BODIES)
async def test_envoy_admits_only_bodies_it_reads_as_the_processor_would(
    body: bytes, status: int, pool: str, local: bool
) -> None:
    """``transport: http`` without limits: the Lua filter's JSON scanner admits a body only
    when it finds the top-level model exactly as the processor's parser would; every other
    body is the processor's, which routes or refuses it with its reason."""
    async with TrafficGateway(with_llm_ports(POLICY), engines()) as gw:
        assert gw.gateway is not None and gw.gateway.llm is not None
        processor = gw.gateway.llm.processor
        got, headers, raw = await post(gw, body)
        assert got == status, raw
        if pool:
            assert headers["x-inferway-pool"] == pool
        assert processor.notices == (1 if local else 0)


@pytest.mark.parametrize("reader", ["auto", "lua"])
async def test_events_cut_across_chunks_are_counted_and_the_usage_chunk_still_dropped(
    reader: str,
) -> None:
    split = FakeOpenAI("qwen", split_events=True)
    policy = with_llm_ports(on_transport(POLICY, "http", reader))
    async with TrafficGateway(policy, [FakeOpenAI("llama"), FakeOpenAI("llama2"), split]) as gw:
        status, _, raw = await post(gw, chat("qwen", stream=True, max_tokens=3))
        assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
        got = events(raw)
        assert [e["choices"][0]["delta"]["content"] for e in got] == ["t0 ", "t1 ", "t2 "]
        assert not any(e.get("usage") for e in got), "the gateway's usage chunk is dropped"
        status, _, raw = await post(gw, chat("qwen", stream=True, usage=True, max_tokens=2))
        assert events(raw)[-1]["usage"]["completion_tokens"] == 2
        assert sample(gw, "inferway_llm_tokens_total", estimated="false", type="output") == 5
        assert sample(gw, "inferway_llm_tokens_total", estimated="false", type="input") == 10
