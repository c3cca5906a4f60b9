"""A paced OpenAI-compatible SSE server for bench/llm_stream.py: the engine the three targets
share when no real one is given (``--engine synthetic``).

It answers ``POST /v1/chat/completions`` (and ``/v1/completions``) as llama.cpp's and vLLM's
servers do: with ``"stream": true``, a role chunk, then one ``chat.completion.chunk`` per token
written on its own (its own TCP segment, never batched), ``--ttft-ms`` before the first token
and ``--token-ms`` between tokens, a final chunk with ``finish_reason``, a usage chunk when the
client asked for ``stream_options.include_usage``, and ``data: [DONE]``; without ``stream``
one JSON answer with ``usage``. ``GET /v1/models`` lists the one model. The pacing is
asyncio sleeps, so the engine costs little CPU and what the targets add is what is measured;
a real engine's CPU would share the host's two cores with the proxies.
"""

from __future__ import annotations

import asyncio
import json
import time
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["engine_main"]


def _chunk(rid: str, model: str, created: int, delta: dict[str, Any], finish: str | None) -> bytes:
    body = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def engine_main(model: str, ttft_ms: float, token_ms: float, conn: Connection) -> None:
    """Serves until told to stop on ``conn``; sends its port first."""
    import uvloop
    from aiohttp import web

    counter = 0

    async def completions(request: web.Request) -> web.StreamResponse:
        nonlocal counter
        body = await request.json()
        counter += 1
        rid = f"chatcmpl-{counter}"
        tokens = int(body.get("max_tokens") or 16)
        prompt = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
        prompt = prompt or len(str(body.get("prompt", "")).split())
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": tokens,
            "total_tokens": prompt + tokens,
        }
        created = int(time.time())
        name = str(body.get("model") or model)
        if not body.get("stream"):
            await asyncio.sleep((ttft_ms + token_ms * (tokens - 1)) / 1000.0)
            text = " ".join(f"t{i}" for i in range(tokens))
            return web.json_response(
                {
                    "id": rid,
                    "object": "chat.completion",
                    "created": created,
                    "model": name,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "finish_reason": "length",
                        }
                    ],
                    "usage": usage,
                }
            )
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        await response.write(_chunk(rid, name, created, {"role": "assistant"}, None))
        await asyncio.sleep(ttft_ms / 1000.0)
        for i in range(tokens):
            if i:
                await asyncio.sleep(token_ms / 1000.0)
            await response.write(_chunk(rid, name, created, {"content": f" t{i}"}, None))
        await response.write(_chunk(rid, name, created, {}, "length"))
        if (body.get("stream_options") or {}).get("include_usage"):
            final = {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": name,
                "choices": [],
                "usage": usage,
            }
            await response.write(b"data: " + json.dumps(final).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def models(_request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "bench"}]}
        )

    async def run() -> None:
        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", completions)
        app.router.add_post("/v1/completions", completions)
        app.router.add_get("/v1/models", models)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        conn.send(runner.addresses[0][1])
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        await runner.cleanup()

    uvloop.run(run())
