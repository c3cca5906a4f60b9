"""A small OpenAI-compatible engine for the LLM gateway's tests and benchmark: aiohttp,
``/v1/chat/completions``, ``/v1/completions`` and ``/v1/embeddings``, streamed (SSE, one
token per chunk, ``include_usage`` honoured as OpenAI does) or not, with its own ``usage``
(prompt tokens: the prompt's whitespace-separated words; completion tokens: ``max_tokens``,
default 8). Tests set ``status`` to make it refuse (429, 503) and read ``bodies`` to see what
reached it; ``first_token_delay`` makes its streams slow to start (a canary with a worse
TTFT); ``stream_fault`` breaks its streams (``"no_done"``: ends without ``data: [DONE]``;
``"bad_json"``: one chunk is not JSON). The real engine (llama.cpp) is tests/llm_engine.py's.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

import orjson
from aiohttp import web

from tests.aiohttp_sites import start_site

__all__ = ["FakeOpenAI"]


def _prompt_words(document: dict[str, Any]) -> int:
    if isinstance(document.get("messages"), list):
        text = " ".join(str(m.get("content", "")) for m in document["messages"])
    else:
        text = str(document.get("prompt", document.get("input", "")))
    return len(text.split())


class FakeOpenAI:
    def __init__(
        self,
        name: str,
        token_delay: float = 0.0,
        split_events: bool = False,
        *,
        first_token_delay: float = 0.0,
        stream_fault: Literal["no_done", "bad_json"] | None = None,
        answer_delay: float = 0.0,
    ) -> None:
        """``split_events``: write each streamed event in two pieces, a moment apart (the
        gateway then gets events cut in the middle); ``answer_delay``: wait that long before
        any answer (its headers too)."""
        self.name = name
        self.split_events = split_events
        self.port = 0
        self.status = 200
        self.token_delay = token_delay
        self.first_token_delay = first_token_delay
        self.stream_fault = stream_fault
        self.answer_delay = answer_delay
        self.bodies: list[bytes] = []
        self.usages: list[tuple[int, int]] = []
        """The usage it reported, per answered request."""
        self._runner: web.AppRunner | None = None

    async def start(self) -> FakeOpenAI:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/v1/models", self._ready)  # the gateway's default probe
        app.router.add_post("/v1/{endpoint:.*}", self._answer)
        self._runner, self.port = await start_site(app, port=self.port, shutdown_timeout=0.05)
        return self

    async def kill(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _ready(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.name}]})

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.bodies.append(raw)
        if self.answer_delay:
            await asyncio.sleep(self.answer_delay)
        if self.status != 200:
            error = {"error": {"message": f"{self.name} refuses", "code": self.status}}
            return web.json_response(error, status=self.status, headers={"x-engine": self.name})
        document = orjson.loads(raw)
        endpoint = request.match_info["endpoint"]
        prompt = _prompt_words(document)
        if endpoint == "embeddings":
            self.usages.append((prompt, 0))
            answer = {
                "object": "list",
                "model": document["model"],
                "data": [{"object": "embedding", "index": 0, "embedding": [0.5] * 8}],
                "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
            }
            return web.json_response(answer, headers={"x-engine": self.name})
        count = int(document.get("max_tokens", 8))
        self.usages.append((prompt, count))
        total = prompt + count
        usage = {"prompt_tokens": prompt, "completion_tokens": count, "total_tokens": total}
        chat = endpoint == "chat/completions"
        if not document.get("stream"):
            text = " ".join(f"t{i}" for i in range(count))
            choice = {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
            answer = {"model": document["model"], "choices": [choice], "usage": usage}
            return web.json_response(answer, headers={"x-engine": self.name})
        response = web.StreamResponse(
            headers={"content-type": "text/event-stream", "x-engine": self.name}
        )
        await response.prepare(request)
        if self.first_token_delay:
            await asyncio.sleep(self.first_token_delay)
        for i in range(count):
            if self.token_delay:
                await asyncio.sleep(self.token_delay)
            if self.stream_fault == "bad_json" and i == count // 2:
                await self._event(response, b"data: {not json\n\n")
                continue
            piece = {"content": f"t{i} "} if chat else None
            choice = {"index": 0, "delta": piece} if chat else {"index": 0, "text": f"t{i} "}
            chunk = {"model": document["model"], "created": int(time.time()), "choices": [choice]}
            await self._event(response, b"data: " + orjson.dumps(chunk) + b"\n\n")
        options = document.get("stream_options") or {}
        if options.get("include_usage"):
            last = {"model": document["model"], "choices": [], "usage": usage}
            await self._event(response, b"data: " + orjson.dumps(last) + b"\n\n")
        if self.stream_fault != "no_done":
            await self._event(response, b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _event(self, response: web.StreamResponse, event: bytes) -> None:
        if not self.split_events:
            await response.write(event)
            return
        half = len(event) // 2
        await response.write(event[:half])
        await asyncio.sleep(0.02)  # its own chunk at the gateway
        await response.write(event[half:])
