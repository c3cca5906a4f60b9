"""The checks of a policy's OpenAI-compatible routes (``openai:`` blocks, docs/llm.md) on a
live gateway: each model name and alias reaches its route's backends (the served-by header
``x-inferway-pool``), streamed and not; a plain answer carries ``usage``; a stream is
well-formed Server-Sent Events of JSON chunks that ends with ``data: [DONE]`` and shows no
usage chunk to a client that did not ask for one (the gateway asks for it and drops it);
a model no route serves gets the OpenAI-style 404 (``model_not_found``).

These are what clients of an LLM gateway trip over (usage missing, broken streams, a model
routed to the wrong engine), so verify judges them from the policy, not from the gateway's
translation of it. Every failed check says which model, route and endpoint, and what came.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from inferway.policies.model import Policy
from inferway.resolve.weights import resolve_backends
from inferway.tools.verify.functional import POOL_HEADER, REPLICA_HEADER

__all__ = [
    "UNKNOWN_MODEL",
    "OpenAICheck",
    "OpenAITarget",
    "chat_body",
    "openai_targets",
    "parse_sse",
    "run_openai_checks",
]

UNKNOWN_MODEL = "inferway-verify-no-such-model"
"""The model name of the 404 check (no policy serves it)."""
_MESSAGES = [{"role": "user", "content": "Say hello."}]


@dataclass(frozen=True)
class OpenAITarget:
    """One OpenAI route as verify expects the gateway to serve it."""

    route: str
    model: str
    """The name the backends serve."""
    names: tuple[str, ...]
    """The model and its aliases: what a client may send as ``model``."""
    prefix: str
    services: tuple[str, ...]
    """The route's services with a share of its traffic."""
    served_by: bool = True


@dataclass(frozen=True)
class OpenAICheck:
    check: str
    """``model routing``, ``usage present``, ``stream integrity`` or ``unknown model``."""
    where: str
    """The request: ``model gpt-4o-mini (route other) POST /v1/chat/completions stream``."""
    ok: bool
    detail: str

    def document(self) -> dict[str, Any]:
        return {"check": self.check, "where": self.where, "ok": self.ok, "detail": self.detail}


def openai_targets(
    policy: Policy,
    listener_port: int | None = None,
    weights: Mapping[str, Mapping[str, float]] | None = None,
) -> list[OpenAITarget]:
    """The policy's openai routes served on the listener at ``listener_port`` (every one
    when no listener has that port); ``weights``: a live rollout's (route -> service ->
    weight), as for the other routes."""
    weights = weights or {}
    names = {lst.name for lst in policy.listeners if lst.port == listener_port}
    out: list[OpenAITarget] = []
    for route in policy.routes:
        openai = getattr(route, "openai", None)
        if openai is None:
            continue
        if names and route.listeners is not None and not names & set(route.listeners):
            continue
        served_by = getattr(route, "served_by_headers", None)
        if served_by is None:
            served_by = getattr(policy, "served_by_headers", True)
        backends = resolve_backends(route, weights.get(route.name))
        services = tuple(b.service for b in backends if b.weight > 0)
        out.append(
            OpenAITarget(
                route=route.name,
                model=openai.model,
                names=(openai.model, *openai.aliases),
                prefix=openai.prefix,
                services=services,
                served_by=bool(served_by),
            )
        )
    return out


def chat_body(model: str, *, stream: bool, max_tokens: int = 4) -> dict[str, Any]:
    """A small chat request (``max_tokens`` always: an engine may otherwise fill its context)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": _MESSAGES,
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    if stream:
        body["stream"] = True
    return body


def parse_sse(raw: bytes) -> tuple[list[dict[str, Any]], bool, str | None]:
    """The JSON chunks of a stream, whether it ended with ``[DONE]`` (and nothing after),
    and the first problem found (None: well-formed)."""
    chunks: list[dict[str, Any]] = []
    done = False
    text = raw.decode("utf-8", errors="replace").replace("\r\n", "\n")
    events = [e for e in text.split("\n\n") if e.strip()]
    for n, event in enumerate(events, 1):
        data = [line[5:].lstrip(" ") for line in event.split("\n") if line.startswith("data:")]
        if not data:
            if all(line.startswith(":") for line in event.split("\n")):
                continue  # a comment (keep-alive)
            return chunks, done, f"event {n} has no data line: {event[:80]!r}"
        payload = "\n".join(data)
        if done:
            return chunks, done, f"event {n} comes after [DONE]: {payload[:80]!r}"
        if payload == "[DONE]":
            done = True
            continue
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return chunks, done, f"event {n} is not JSON: {payload[:80]!r}"
        if not isinstance(chunk, dict):
            return chunks, done, f"event {n} is not a JSON object: {payload[:80]!r}"
        chunks.append(chunk)
    if not done:
        return chunks, done, f"the stream ended after {len(events)} events without [DONE]"
    return chunks, done, None


def _routing(target: OpenAITarget, response: httpx.Response) -> str | None:
    """What is wrong with who answered (None: the right pool, or it cannot be seen)."""
    if response.status_code != 200:
        return f"HTTP {response.status_code}: {response.text[:200]!r}"
    if not target.served_by:
        return None
    pool = response.headers.get(POOL_HEADER)
    if pool not in target.services:
        replica = response.headers.get(REPLICA_HEADER) or "?"
        return (
            f"served by pool {pool or 'none'} ({replica}); the policy routes it to "
            f"{' | '.join(target.services)}"
        )
    return None


async def _plain(client: httpx.AsyncClient, target: OpenAITarget, name: str) -> list[OpenAICheck]:
    path = f"{target.prefix}/chat/completions"
    where = f"model {name} (route {target.route}) POST {path}"
    try:
        response = await client.post(path, json=chat_body(name, stream=False))
    except httpx.HTTPError as error:
        return [OpenAICheck("model routing", where, False, f"no answer: {error!r}")]
    wrong = _routing(target, response)
    checks = [OpenAICheck("model routing", where, wrong is None, wrong or "routed as the policy")]
    if response.status_code != 200:
        return checks
    try:
        usage = orjson.loads(response.content).get("usage")
    except (orjson.JSONDecodeError, AttributeError):
        usage = None
        problem = f"the answer is not a JSON object: {response.content[:120]!r}"
    else:
        problem = f"no usage block with prompt and completion tokens: {usage!r}"
    ok = isinstance(usage, dict) and all(
        isinstance(usage.get(k), int) for k in ("prompt_tokens", "completion_tokens")
    )
    if ok:
        assert isinstance(usage, dict)
        problem = f"{usage['prompt_tokens']} prompt + {usage['completion_tokens']} completion"
    checks.append(OpenAICheck("usage present", where, ok, problem))
    return checks


async def _stream(client: httpx.AsyncClient, target: OpenAITarget, name: str) -> list[OpenAICheck]:
    path = f"{target.prefix}/chat/completions"
    where = f"model {name} (route {target.route}) POST {path} stream"
    try:
        response = await client.post(path, json=chat_body(name, stream=True))
    except httpx.HTTPError as error:
        return [OpenAICheck("model routing", where, False, f"no answer: {error!r}")]
    wrong = _routing(target, response)
    checks = [OpenAICheck("model routing", where, wrong is None, wrong or "routed as the policy")]
    if response.status_code != 200:
        return checks
    content_type = response.headers.get("content-type", "")
    chunks, _, problem = parse_sse(response.content)
    if problem is None and not content_type.startswith("text/event-stream"):
        problem = f"content-type is {content_type!r}, not text/event-stream"
    if problem is None and any(c.get("usage") for c in chunks):
        problem = "a usage chunk reached a client that did not ask for one (include_usage)"
    if problem is None and not chunks:
        problem = "no chunk before [DONE]"
    detail = problem or f"{len(chunks)} chunks, then [DONE]"
    checks.append(OpenAICheck("stream integrity", where, problem is None, detail))
    return checks


async def _unknown(client: httpx.AsyncClient, prefix: str) -> OpenAICheck:
    path = f"{prefix}/chat/completions"
    where = f"model {UNKNOWN_MODEL} (no route) POST {path}"
    try:
        response = await client.post(path, json=chat_body(UNKNOWN_MODEL, stream=False))
    except httpx.HTTPError as error:
        return OpenAICheck("unknown model", where, False, f"no answer: {error!r}")
    try:
        code = orjson.loads(response.content)["error"]["code"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        code = None
    ok = response.status_code == 404 and code == "model_not_found"
    detail = f"HTTP {response.status_code}, error code {code!r}"
    if not ok:
        wanted = "an OpenAI-style 404 with code model_not_found expected"
        detail += f" ({wanted}): {response.text[:160]!r}"
    return OpenAICheck("unknown model", where, ok, detail)


async def run_openai_checks(
    gateway: str, targets: list[OpenAITarget], *, timeout: float = 60.0
) -> list[OpenAICheck]:
    """Every check of every target's names, then the 404 of each prefix, in that order
    (one request at a time: an engine such as llama.cpp's serves one at a time anyway)."""
    checks: list[OpenAICheck] = []
    async with httpx.AsyncClient(base_url=gateway, timeout=timeout, trust_env=False) as client:
        for target in targets:
            for name in target.names:
                checks += await _plain(client, target, name)
                checks += await _stream(client, target, name)
        for prefix in sorted({t.prefix for t in targets}):
            checks.append(await _unknown(client, prefix))
    return checks
