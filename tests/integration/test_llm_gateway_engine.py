"""The LLM gateway against a real engine: llama.cpp (llama-cpp-python's OpenAI-compatible
server, tests/llm_engine.py) on two tiny models, through real Envoy and the real LLM
processor. The body's model picks the engine, streamed and not; what the gateway counts
equals the engine's own ``usage`` (this engine never sends usage in a stream, even when
asked: the gateway then counts one token per chunk, which is exact here, and marks the count
estimated; the client still sees no usage chunk); a 1 MiB prompt reaches the engine whole
(its exact token count comes back); a token-per-minute limit answers 429 with Retry-After;
a replica answering 429 is fallen back from to the real engine. Against llama.cpp's C++
``llama-server``, which honours ``include_usage``, a stream whose client did not ask for usage
is counted exactly from the usage chunk the gateway asked for, and the client still sees none."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from inferway.devtools.tiny_gguf import count_tokens
from tests.envoy_process import with_llm_ports
from tests.llm_engine import (
    LLMEngine,
    require_llama_server,
    require_llm_engine,
    start_llama_server,
    start_llm_engine,
    write_test_model,
)
from tests.openai_fake import FakeOpenAI
from tests.traffic_harness import TrafficGateway

pytestmark = pytest.mark.asyncio

POLICY = """
version: 1
listeners:
  - name: ingress
    port: {listener_port}
llm:
  port: LLM_PORT
  reports_port: LLM_REPORTS_PORT
  timeout: 30s
  limits:
    tokens_per_minute: 100
services:
  - name: tiny-pool
    endpoints: ["127.0.0.1:{refuser}", "127.0.0.1:TINY_PORT"]
  - name: other-pool
    endpoints: ["127.0.0.1:OTHER_PORT"]
routes:
  - name: tiny
    openai:
      model: tiny
    backends:
      - service: tiny-pool
  - name: other
    openai:
      model: other
      aliases: [gpt-4o-mini]
    backends:
      - service: other-pool
"""
MESSAGES = [{"role": "user", "content": "Hello there"}]


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Any:
    require_llm_engine()
    directory = tmp_path_factory.mktemp("llm")
    tiny, other = write_test_model(directory, seed=0), write_test_model(directory, seed=1)
    with start_llm_engine(tiny, model="tiny") as a, start_llm_engine(other, model="other") as b:
        yield a, b


@pytest.fixture
async def gateway(engines: tuple[LLMEngine, LLMEngine]) -> AsyncIterator[TrafficGateway]:
    tiny, other = engines
    refuser = FakeOpenAI("refuser")
    refuser.status = 429
    policy = (
        with_llm_ports(POLICY)
        .replace("TINY_PORT", str(tiny.port))
        .replace("OTHER_PORT", str(other.port))
    )
    async with TrafficGateway(policy, [refuser]) as gw:
        yield gw


async def post(
    gw: TrafficGateway, path: str, body: dict[str, Any], key: str = "sk-test"
) -> tuple[int, dict[str, str], bytes]:
    assert gw.session is not None
    async with gw.session.post(
        gw.url + path, json=body, headers={"x-api-key": key}, timeout=None
    ) as response:
        raw = await response.read()
        return response.status, {k.lower(): v for k, v in response.headers.items()}, raw


def counted(gw: TrafficGateway, name: str, **labels: str) -> float:
    assert gw.gateway is not None and gw.gateway.llm is not None
    total = 0.0
    for metric in gw.gateway.llm.processor.metrics.registry.collect():
        for s in metric.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


async def direct_usage(engine: LLMEngine, body: dict[str, Any]) -> dict[str, int]:
    async with httpx.AsyncClient(trust_env=False, timeout=60) as client:
        answer = await client.post(f"{engine.url}/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    usage: dict[str, int] = answer.json()["usage"]
    return usage


async def test_the_model_picks_the_engine_and_usage_equals_the_engines(
    gateway: TrafficGateway, engines: tuple[LLMEngine, LLMEngine]
) -> None:
    gw = gateway
    tiny, other = engines
    for model, engine, route in (("tiny", tiny, "tiny"), ("gpt-4o-mini", other, "other")):
        body = {"model": model, "messages": MESSAGES, "max_tokens": 5, "temperature": 0}
        status, headers, raw = await post(gw, "/v1/chat/completions", body, key=f"sk-{route}")
        assert status == 200, raw
        assert headers["x-inferway-replica"] == f"127.0.0.1:{engine.port}"
        usage = await direct_usage(engine, body)
        assert json.loads(raw)["usage"] == usage
        labels = {"route": route, "estimated": "false"}
        assert (
            counted(gw, "inferway_llm_tokens_total", type="input", **labels)
            == usage["prompt_tokens"]
        )
        assert (
            counted(gw, "inferway_llm_tokens_total", type="output", **labels)
            == usage["completion_tokens"]
        )


async def test_a_stream_the_client_asked_no_usage_for_is_counted_and_shows_none(
    gateway: TrafficGateway, engines: tuple[LLMEngine, LLMEngine]
) -> None:
    gw = gateway
    tiny, _ = engines
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 7, "temperature": 0}
    status, headers, raw = await post(gw, "/v1/chat/completions", {**body, "stream": True})
    assert status == 200 and headers["x-inferway-replica"] == f"127.0.0.1:{tiny.port}"
    payloads = [b[6:] for b in raw.decode().split("\n\n") if b.startswith("data: ")]
    assert payloads[-1] == "[DONE]"
    assert not any("usage" in json.loads(p) for p in payloads[:-1]), "no usage chunk shown"
    usage = await direct_usage(tiny, body)
    assert (
        counted(gw, "inferway_llm_tokens_total", route="tiny", type="output")
        == usage["completion_tokens"]
    )
    assert counted(gw, "inferway_llm_tokens_total", route="tiny", estimated="true") > 0, (
        "the engine sent no usage: the count says it is estimated"
    )
    assert counted(gw, "gen_ai_server_time_to_first_token_seconds_count", route="tiny") == 1
    assert counted(gw, "gen_ai_server_time_per_output_token_seconds_count", route="tiny") == 1


async def test_a_one_mib_prompt_reaches_the_engine_whole(
    gateway: TrafficGateway,
) -> None:
    prompt = ("The quick brown fox jumps over the lazy dog. " * 23302)[: 1 << 20]
    for model in ("tiny", "gpt-4o-mini"):  # untouched, then rewritten on the way (an alias)
        body = {"model": model, "prompt": prompt, "max_tokens": 8}
        status, _, raw = await post(gateway, "/v1/completions", body, key=f"sk-big-{model}")
        assert status == 400, raw[:300]
        error = json.loads(raw)["error"]
        assert error["code"] == "context_length_exceeded"
        assert f"({count_tokens(prompt)} in your prompt; 8 for the completion)" in error["message"]


async def test_a_token_per_minute_limit_answers_429_with_retry_after(
    gateway: TrafficGateway,
) -> None:
    gw = gateway
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 40, "temperature": 0}
    for _ in range(2):  # ~35 prompt + 40 completion tokens each: the second crosses 100
        status, _, raw = await post(gw, "/v1/chat/completions", body, key="sk-limited")
        assert status == 200, raw
    status, headers, raw = await post(gw, "/v1/chat/completions", body, key="sk-limited")
    assert status == 429
    assert 1 <= int(headers["retry-after"]) <= 60
    error = json.loads(raw)["error"]
    assert (error["code"], error["limit_tokens"]) == ("tokens_per_minute", 100)
    status, _, _ = await post(gw, "/v1/chat/completions", body, key="sk-someone-else")
    assert status == 200


async def test_a_replica_answering_429_falls_back_to_the_engine(
    gateway: TrafficGateway, engines: tuple[LLMEngine, LLMEngine]
) -> None:
    gw = gateway
    tiny, _ = engines
    refuser = gw.backends["refuser"]
    for i in range(4):
        body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 3, "stream": i % 2 == 1}
        status, headers, raw = await post(gw, "/v1/chat/completions", body, key=f"sk-{i}")
        assert status == 200, raw
        assert headers["x-inferway-replica"] == f"127.0.0.1:{tiny.port}"
    assert refuser.bodies, "the refusing replica was asked, and fallen back from"
    assert counted(gw, "inferway_llm_requests_total", route="tiny", code="429") == 0


LLAMA_SERVER_POLICY = """
version: 1
listeners:
  - name: ingress
    port: {listener_port}
llm:
  port: LLM_PORT
  reports_port: LLM_REPORTS_PORT
  timeout: 30s
services:
  - name: llama-pool
    endpoints: ["127.0.0.1:LLAMA_PORT"]
routes:
  - name: llama
    openai:
      model: tiny
    backends:
      - service: llama-pool
"""


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    require_llama_server()
    model = write_test_model(tmp_path_factory.mktemp("llama-server"))
    with start_llama_server(model, parallel=2) as engine:
        yield engine


async def test_llama_server_usage_the_gateway_asked_for_is_exact_and_hidden(
    llama_server: LLMEngine,
) -> None:
    """llama-server sends the usage chunk the gateway adds ``include_usage`` for: the count
    is the engine's own (not estimated), and the client that did not ask sees no usage."""
    policy = with_llm_ports(LLAMA_SERVER_POLICY).replace("LLAMA_PORT", str(llama_server.port))
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 7, "temperature": 0}
    async with TrafficGateway(policy, []) as gw:
        status, headers, raw = await post(gw, "/v1/chat/completions", {**body, "stream": True})
        assert status == 200, raw
        assert headers["x-inferway-replica"] == f"127.0.0.1:{llama_server.port}"
        payloads = [b[6:] for b in raw.decode().split("\n\n") if b.startswith("data: ")]
        assert payloads[-1] == "[DONE]"
        chunks = [json.loads(p) for p in payloads[:-1]]
        assert not any("usage" in chunk for chunk in chunks), "no usage chunk shown"
        assert all(chunk["choices"] for chunk in chunks)
        assert sum(bool(c["choices"][0]["delta"].get("content")) for c in chunks) == 7
        usage = await direct_usage(llama_server, body)
        exact = {"route": "llama", "estimated": "false"}
        assert (
            counted(gw, "inferway_llm_tokens_total", type="input", **exact)
            == (usage["prompt_tokens"])
        )
        assert (
            counted(gw, "inferway_llm_tokens_total", type="output", **exact)
            == (usage["completion_tokens"])
        )
        assert counted(gw, "inferway_llm_tokens_total", route="llama", estimated="true") == 0
        assert counted(gw, "gen_ai_server_time_to_first_token_seconds_count", route="llama") == 1
