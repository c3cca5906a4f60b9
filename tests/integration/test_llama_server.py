"""llama.cpp's own C++ ``llama-server`` for real, on the tiny model, over HTTP on loopback
(tests/llm_engine.py ``start_llama_server``): what it does that llama-cpp-python's server does
not, and what the gateway's usage counting, endpoint picking and load signals rely on.

``usage`` is the tokenizer's own count; a stream sent with ``stream_options.include_usage``
ends with a usage chunk (no choices) equal to the non-streamed count, and one sent without it
has none; ``/metrics`` serves the ``llamacpp:*`` metrics, whose token counters move by exactly
the requests' usage; a repeated prefix is served from the slot's cache and reported as
``prompt_tokens_details.cached_tokens``; two slots decode two streams at once where one slot
serves them one after the other.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferway.devtools.tiny_gguf import count_tokens
from tests.llm_engine import LLMEngine, require_llama_server, start_llama_server, write_test_model

N_CTX = 4096
MESSAGES = [{"role": "user", "content": "Hello there"}]
RENDERED = "<|user|>Hello there\n<|assistant|>"  # MESSAGES through the model's chat template
METRICS = {
    # counters
    "prompt_tokens_total",
    "prompt_tokens_cached_total",
    "prompt_seconds_total",
    "tokens_predicted_total",
    "tokens_predicted_seconds_total",
    "n_decode_total",
    "n_tokens_max",
    # gauges
    "prompt_tokens_seconds",
    "predicted_tokens_seconds",
    "requests_processing",
    "requests_deferred",
    "n_busy_slots_per_decode",
}
"""The ``llamacpp:`` metrics this build serves that endpoint picking and dashboards use (it
also serves ``spec_decode_*``; it has no KV-cache usage gauge)."""


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_llama_server()
    return write_test_model(tmp_path_factory.mktemp("llama-server"))


@pytest.fixture(scope="module")
def engine(model: Path) -> Iterator[LLMEngine]:
    with start_llama_server(model, n_ctx=N_CTX, parallel=2) as running:
        yield running


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(trust_env=False, timeout=60.0) as http:
        yield http


def _chat(
    max_tokens: int, messages: list[dict[str, str]] = MESSAGES, **extra: Any
) -> dict[str, Any]:
    return {
        "model": "tiny",
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }


def _chunks(client: httpx.Client, url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON chunks of a streamed response, in order, after checking it ends in [DONE]."""
    with client.stream("POST", url, json=body) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        payloads = [
            line.removeprefix("data: ")
            for line in response.iter_lines()
            if line.startswith("data:")
        ]
    assert payloads[-1] == "[DONE]", payloads[-3:]
    return [json.loads(payload) for payload in payloads[:-1]]


def _metrics(client: httpx.Client, engine: LLMEngine) -> dict[str, float]:
    """``llamacpp:*`` samples by name, without the prefix, as the exposition names them (all
    are unlabelled)."""
    response = client.get(f"{engine.url}/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for line in response.text.splitlines():
        if line.startswith("llamacpp:"):
            name, value = line.split()
            samples[name.removeprefix("llamacpp:")] = float(value)
    return samples


def test_health_models_and_slots(engine: LLMEngine, client: httpx.Client) -> None:
    assert client.get(f"{engine.url}/health").json() == {"status": "ok"}
    models = client.get(f"{engine.url}/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny"]
    slots = client.get(f"{engine.url}/slots").json()
    assert [(s["id"], s["n_ctx"]) for s in slots] == [(0, N_CTX // 2), (1, N_CTX // 2)]


def test_chat_completion_usage_is_the_tokenizers_count(
    engine: LLMEngine, client: httpx.Client
) -> None:
    body = client.post(f"{engine.url}/v1/chat/completions", json=_chat(16)).json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["finish_reason"] == "length"
    usage = body["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (
        count_tokens(RENDERED),
        16,
        count_tokens(RENDERED) + 16,
    )
    assert 0 <= usage["prompt_tokens_details"]["cached_tokens"] < usage["prompt_tokens"]
    content = body["choices"][0]["message"]["content"]
    assert len(content) == 16 and content.isprintable(), content


def test_a_stream_with_include_usage_ends_with_the_non_streamed_usage(
    engine: LLMEngine, client: httpx.Client
) -> None:
    url = f"{engine.url}/v1/chat/completions"
    whole = client.post(url, json=_chat(12)).json()
    expected = {
        k: whole["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")
    }

    chunks = _chunks(client, url, _chat(12, stream=True, stream_options={"include_usage": True}))
    *streamed, last = chunks
    assert last["choices"] == [] and last["object"] == "chat.completion.chunk"
    assert {k: last["usage"][k] for k in expected} == expected
    assert not any("usage" in chunk for chunk in streamed)
    deltas = [c["choices"][0]["delta"].get("content") for c in streamed]
    assert "".join(d for d in deltas if d) == whole["choices"][0]["message"]["content"]
    assert streamed[-1]["choices"][0]["finish_reason"] == "length"

    plain = _chunks(client, url, _chat(12, stream=True))
    assert not any("usage" in chunk for chunk in plain)
    assert plain[-1]["choices"][0]["finish_reason"] == "length"


def test_metrics_count_the_requests_tokens(engine: LLMEngine, client: httpx.Client) -> None:
    before = _metrics(client, engine)
    assert before.keys() >= METRICS, sorted(before)
    messages = [{"role": "user", "content": f"metrics {time.monotonic_ns()}"}]
    usage = client.post(f"{engine.url}/v1/chat/completions", json=_chat(9, messages)).json()[
        "usage"
    ]
    after = _metrics(client, engine)
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert after["tokens_predicted_total"] - before["tokens_predicted_total"] == 9
    assert after["prompt_tokens_total"] - before["prompt_tokens_total"] == (
        usage["prompt_tokens"] - cached
    )
    assert after["prompt_tokens_cached_total"] - before["prompt_tokens_cached_total"] == cached
    assert after["requests_processing"] == after["requests_deferred"] == 0


def test_a_repeated_prefix_is_a_prompt_cache_hit(engine: LLMEngine, client: httpx.Client) -> None:
    """The slot keeps the last prompt's KV cache: a request sharing its prefix only computes
    the rest, and says how many tokens it reused."""
    url = f"{engine.url}/v1/chat/completions"
    shared = f"You are a careful assistant, run {time.monotonic_ns()}. " * 8

    def rendered(question: str) -> str:
        return f"<|user|>{shared}{question}\n<|assistant|>"

    def cached(question: str) -> tuple[int, int]:
        messages = [{"role": "user", "content": shared + question}]
        usage = client.post(url, json=_chat(2, messages)).json()["usage"]
        assert usage["prompt_tokens"] == count_tokens(rendered(question))
        return usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"]

    first, _ = cached("What is one?")
    assert first < count_tokens(shared) // 2  # a new prefix: (almost) nothing reused
    hit, prompt_tokens = cached("Why is two?")
    # exactly the tokens the two prompts share ("What" and "Why": up to "Wh"), nothing after
    assert hit == count_tokens(f"<|user|>{shared}Wh")
    assert hit < prompt_tokens
    again, _ = cached("Why is two?")
    assert again == prompt_tokens - 1  # the whole prompt but its last token, recomputed


def _timed_stream(url: str, max_tokens: int, first: threading.Event) -> list[float]:
    """Arrival times of a stream's content chunks; sets ``first`` at the first one."""
    times: list[float] = []
    with httpx.Client(trust_env=False, timeout=120.0) as http:
        body = _chat(max_tokens, stream=True)
        with http.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            for line in response.iter_lines():
                if line.startswith("data: {") and '"content":"' in line:
                    times.append(time.monotonic())
                    first.set()
    first.set()
    return times


def _two_streams(engine: LLMEngine, max_tokens: int) -> tuple[list[float], list[float]]:
    """Stream A, and stream B once A's first token has arrived: the arrival times of each."""
    results: dict[str, list[float]] = {}
    a_started, b_started = threading.Event(), threading.Event()

    def a() -> None:
        results["a"] = _timed_stream(engine.url, max_tokens, a_started)

    def b() -> None:
        a_started.wait(timeout=60)
        results["b"] = _timed_stream(engine.url, max_tokens, b_started)

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    assert sorted(results) == ["a", "b"], f"a stream did not finish: {engine.log_tail()}"
    assert [len(results["a"]), len(results["b"])] == [max_tokens, max_tokens]
    return results["a"], results["b"]


def test_two_slots_serve_two_streams_at_once(model: Path, client: httpx.Client) -> None:
    """With two slots a second stream is decoded alongside the first (its tokens arrive while
    the first's still do, and the server's own average of busy slots per decode goes above
    one); with one slot it waits until the first is done."""
    tokens, n_ctx = 2000, 4096  # 2048 per slot with two: a stream of a second or more
    with start_llama_server(model, n_ctx=n_ctx, parallel=2) as two:
        a, b = _two_streams(two, tokens)
        busy = _metrics(client, two)["n_busy_slots_per_decode"]
    assert b[0] < a[-1], f"B began {b[0] - a[-1]:.3f} s after A ended ({a[-1] - a[0]:.3f} s long)"
    assert busy > 1.0
    with start_llama_server(model, n_ctx=n_ctx // 2, parallel=1) as one:
        a, b = _two_streams(one, tokens)
        busy = _metrics(client, one)["n_busy_slots_per_decode"]
    assert a[-1] <= b[0], f"B began {a[-1] - b[0]:.3f} s before A ended"
    assert busy == 1.0
