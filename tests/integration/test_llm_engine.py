"""The test LLM engine for real: llama-cpp-python's OpenAI-compatible server on the tiny model
inferway/devtools/tiny_gguf.py writes, over HTTP on loopback (tests/llm_engine.py).

These pin down what the gateway's LLM tests rely on: the OpenAI routes answer, ``usage``
equals the tokenizer's own count (``count_tokens``) and ``max_tokens`` (the model never ends
early), a stream is ``data:`` chunks ending in ``[DONE]`` with one content chunk per token and
no usage chunk even when asked (the engine ignores ``stream_options``), a 1 MiB prompt reaches
the engine whole and is refused with 400 naming its exact token count, and several engines
run at once.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferway.devtools.tiny_gguf import count_tokens
from tests.llm_engine import LLMEngine, require_llm_engine, start_llm_engine, write_test_model

N_CTX = 4096
MESSAGES = [{"role": "user", "content": "Hello there"}]
RENDERED = "<|user|>Hello there\n<|assistant|>"  # MESSAGES through the model's chat template


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_llm_engine()
    return write_test_model(tmp_path_factory.mktemp("llm"))


@pytest.fixture(scope="module")
def engine(model: Path) -> Iterator[LLMEngine]:
    with start_llm_engine(model, n_ctx=N_CTX, cache=True) as running:
        yield running


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(trust_env=False, timeout=60.0) as http:
        yield http


def _chat(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": "tiny",
        "messages": MESSAGES,
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }


def _sse(client: httpx.Client, url: str, body: dict[str, Any]) -> list[str]:
    """The ``data:`` payloads of a streamed response, in order."""
    with client.stream("POST", url, json=body) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return [
            line.removeprefix("data: ")
            for line in response.iter_lines()
            if line.startswith("data:")
        ]


def test_models_lists_the_alias_and_any_name_is_served(
    engine: LLMEngine, client: httpx.Client
) -> None:
    models = client.get(f"{engine.url}/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny"]
    # one model served: any requested name gets it, and the answer echoes the name asked for
    request = _chat(4) | {"model": "gpt-4o"}
    body = client.post(f"{engine.url}/v1/chat/completions", json=request).json()
    assert body["model"] == "gpt-4o"
    assert body["usage"]["completion_tokens"] == 4


def test_chat_completion_usage_is_the_tokenizers_count(
    engine: LLMEngine, client: httpx.Client
) -> None:
    body = client.post(f"{engine.url}/v1/chat/completions", json=_chat(16)).json()
    choice = body["choices"][0]
    assert body["object"] == "chat.completion"
    assert choice["finish_reason"] == "length"
    assert body["usage"] == {
        "prompt_tokens": count_tokens(RENDERED),
        "completion_tokens": 16,
        "total_tokens": count_tokens(RENDERED) + 16,
    }
    content = choice["message"]["content"]
    # one printable character per token: never </s>, never a lone byte
    assert len(content) == 16 and content.isprintable(), content
    again = client.post(f"{engine.url}/v1/chat/completions", json=_chat(16)).json()
    assert again["choices"][0]["message"]["content"] == content  # temperature 0: greedy


def test_stream_is_one_chunk_per_token_then_done_and_no_usage_chunk(
    engine: LLMEngine, client: httpx.Client
) -> None:
    url = f"{engine.url}/v1/chat/completions"
    whole = client.post(url, json=_chat(12)).json()["choices"][0]["message"]["content"]
    for extra in ({}, {"stream_options": {"include_usage": True}}):
        payloads = _sse(client, url, _chat(12, stream=True, **extra))
        assert payloads[-1] == "[DONE]"
        chunks = [json.loads(p) for p in payloads[:-1]]
        assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
        deltas = [c["choices"][0]["delta"].get("content") for c in chunks[1:-1]]
        assert len(deltas) == 12 and "".join(deltas) == whole
        assert chunks[-1]["choices"][0] == {
            "index": 0,
            "delta": {},
            "logprobs": None,
            "finish_reason": "length",
        }
        # llama-cpp-python ignores stream_options: a gateway must count such a stream itself
        assert not any("usage" in c for c in chunks), extra


def test_completions(engine: LLMEngine, client: httpx.Client) -> None:
    prompt = "Once upon a time, ünïcode"
    body = client.post(
        f"{engine.url}/v1/completions",
        json={"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0},
    ).json()
    assert body["object"] == "text_completion"
    assert body["usage"] == {
        "prompt_tokens": count_tokens(prompt),
        "completion_tokens": 8,
        "total_tokens": count_tokens(prompt) + 8,
    }
    assert len(body["choices"][0]["text"]) == 8


@pytest.mark.parametrize("text", ["", "plain", " two  spaces ", "héllo wörld ✓\n\ttab"])
def test_count_tokens_is_the_engines_tokenizer(
    engine: LLMEngine, client: httpx.Client, text: str
) -> None:
    count = client.post(f"{engine.url}/extras/tokenize/count", json={"input": text}).json()
    assert count == {"count": count_tokens(text)}


def test_a_1_mib_prompt_arrives_whole_and_is_refused_cleanly(
    engine: LLMEngine, client: httpx.Client
) -> None:
    prompt = ("The quick brown fox jumps over the lazy dog. " * 23302)[: 1 << 20]
    response = client.post(
        f"{engine.url}/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 8}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    # the exact token count of the whole MiB: nothing lost or added on the way
    assert f"({count_tokens(prompt)} in your prompt; 8 for the completion)" in error["message"]
    assert engine.running()


def test_the_context_limit_is_prompt_tokens_below_n_ctx(
    engine: LLMEngine, client: httpx.Client
) -> None:
    """A prompt of n_ctx - 1 tokens is served (max_tokens cut to what the context leaves); one
    of n_ctx tokens is refused."""
    fits = "a" * (N_CTX - 3)  # + BOS + the space prefix
    body = client.post(
        f"{engine.url}/v1/completions", json={"model": "tiny", "prompt": fits, "max_tokens": 8}
    ).json()
    assert body["usage"] == {
        "prompt_tokens": N_CTX - 1,
        "completion_tokens": 1,
        "total_tokens": N_CTX,
    }
    refused = client.post(
        f"{engine.url}/v1/completions",
        json={"model": "tiny", "prompt": fits + "a", "max_tokens": 8},
    )
    assert refused.status_code == 400
    assert f"({N_CTX} in your prompt" in refused.json()["error"]["message"]


def test_prompt_cache_reuses_an_earlier_prompt(engine: LLMEngine, client: httpx.Client) -> None:
    """llama-cpp-python's RAM cache (``cache=True``) keeps the KV state of earlier prompts:
    going back to one after another is a hit, which the server logs (verbose)."""
    first, second = "first " * 200, "second " * 200

    def complete(prompt: str) -> int:
        """Send ``prompt``; the cache hits logged so far."""
        response = client.post(
            f"{engine.url}/v1/completions",
            json={"model": "tiny", "prompt": prompt, "max_tokens": 2},
        )
        assert response.status_code == 200
        return engine.log.read_text(errors="replace").count("_create_completion: cache hit")

    complete(first)
    hits = complete(second)
    assert complete(first) == hits + 1


def test_concurrent_streams_are_served_one_after_the_other_complete(
    engine: LLMEngine,
) -> None:
    """One request at a time (no parallel slots); with interrupt_requests off a second request
    waits instead of cutting the running stream short."""
    results: list[list[str]] = []

    def stream() -> None:
        with httpx.Client(trust_env=False, timeout=60.0) as http:
            results.append(_sse(http, f"{engine.url}/v1/chat/completions", _chat(64, stream=True)))

    threads = [threading.Thread(target=stream) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(results) == 3
    for payloads in results:
        assert payloads[-1] == "[DONE]"
        assert json.loads(payloads[-2])["choices"][0]["finish_reason"] == "length"
        assert len(payloads) == 64 + 3  # role, 64 tokens, finish, [DONE]


def test_embeddings(model: Path, client: httpx.Client) -> None:
    with start_llm_engine(model, embedding=True) as embedder:
        body = client.post(
            f"{embedder.url}/v1/embeddings", json={"model": "tiny", "input": ["hi there", "x"]}
        ).json()
    assert [len(item["embedding"]) for item in body["data"]] == [64, 64]  # mean-pooled
    assert body["data"][0]["embedding"] != body["data"][1]["embedding"]
    assert body["usage"]["prompt_tokens"] == count_tokens("hi there") + count_tokens("x")


def test_several_engines_at_once(model: Path, tmp_path: Path, client: httpx.Client) -> None:
    other = write_test_model(tmp_path, seed=1)
    engines: list[LLMEngine] = []
    try:
        for i, path in enumerate([model, other] * 2):
            engines.append(start_llm_engine(path, model=f"m{i}"))
        answers = []
        for running in engines:
            request = _chat(8) | {"model": running.model}
            body = client.post(f"{running.url}/v1/chat/completions", json=request).json()
            assert body["model"] == running.model
            answers.append(body["choices"][0]["message"]["content"])
        assert len({e.pid for e in engines}) == len({e.port for e in engines}) == 4
        assert answers[0] == answers[2] and answers[1] == answers[3]  # same model, same answer
        assert answers[0] != answers[1]  # another seed, another model
    finally:
        for running in engines:
            running.stop()
    assert not any(running.running() for running in engines)
