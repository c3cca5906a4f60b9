"""The load run of OpenAI routes: ``users`` concurrent clients stream chat completions
through the gateway, back to back, for a bounded time, cycling through every model name
and alias of the policy; measured as an LLM client sees it: time to first token (TTFT:
request sent to the first chunk with generated text), inter-token latency (ITL: per
request, the time from its first to its last chunk with text over the tokens after the
first, as the gateway's ``gen_ai_server_time_per_output_token`` and OpenTelemetry define
it; chunks read together are not zero gaps) and tokens/s (chunks with text over the run;
engines stream one token per chunk).

Not locust: a stream's interesting times are inside one answer, which locust's per-request
timing does not see. Load is aimed at loopback only unless ``--allow-remote`` (load.py).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from inferway.tools.verify.openai_checks import OpenAITarget, chat_body

__all__ = ["LLMLoadReport", "run_llm_load"]


def _quantile(values: list[float], q: float) -> float | None:
    """The nearest-rank quantile (exact over every sample; None when there are none)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q * len(ordered))))
    return ordered[rank - 1]


@dataclass
class LLMLoadReport:
    users: int
    duration_s: float
    max_tokens: int
    max_error_percent: float
    requests: int = 0
    errors: int = 0
    tokens: int = 0
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)

    @property
    def error_percent(self) -> float:
        return 100.0 * self.errors / self.requests if self.requests else 0.0

    @property
    def ok(self) -> bool:
        return self.requests > 0 and self.error_percent <= self.max_error_percent

    def document(self) -> dict[str, Any]:
        def ms(values: list[float]) -> dict[str, float | None]:
            out: dict[str, float | None] = {}
            for name, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
                v = _quantile(values, q)
                out[name] = None if v is None else round(1000 * v, 3)
            return out

        return {
            "users": self.users,
            "duration_s": round(self.duration_s, 3),
            "max_tokens": self.max_tokens,
            "requests": self.requests,
            "errors": self.errors,
            "error_percent": round(self.error_percent, 4),
            "max_error_percent": self.max_error_percent,
            "statuses": dict(self.statuses),
            "tokens": self.tokens,
            "tokens_per_s": round(self.tokens / self.duration_s, 3) if self.duration_s else 0.0,
            "ttft_ms": ms(self.ttft_s),
            "itl_ms": ms(self.itl_s),
            "ok": self.ok,
        }


def _has_text(payload: bytes) -> bool:
    try:
        chunk = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return False
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    for choice in choices if isinstance(choices, list) else ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if (isinstance(delta, dict) and delta.get("content")) or choice.get("text"):
            return True
    return False


async def _one(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], report: LLMLoadReport
) -> None:
    """One streamed request: its TTFT and ITL gaps into the report, or an error."""
    started = time.monotonic()
    times: list[float] = []
    done = False
    report.requests += 1
    try:
        async with client.stream("POST", path, json=body) as response:
            report.statuses[str(response.status_code)] += 1
            if response.status_code != 200:
                await response.aread()
                report.errors += 1
                return
            pending = b""
            async for piece in response.aiter_raw():
                now = time.monotonic()
                pending += piece
                *events, pending = pending.replace(b"\r\n", b"\n").split(b"\n\n")
                for event in events:
                    for line in event.split(b"\n"):
                        if not line.startswith(b"data:"):
                            continue
                        data = line[5:].strip()
                        if data == b"[DONE]":
                            done = True
                        elif _has_text(data):
                            times.append(now)
    except httpx.HTTPError as error:
        report.statuses[type(error).__name__] += 1
        report.errors += 1
        return
    if not done or not times:
        report.errors += 1
        report.statuses["no [DONE]" if not done else "no tokens"] += 1
        return
    report.tokens += len(times)
    report.ttft_s.append(times[0] - started)
    if len(times) > 1:
        report.itl_s.append((times[-1] - times[0]) / (len(times) - 1))


async def run_llm_load(
    gateway: str,
    targets: list[OpenAITarget],
    *,
    users: int,
    duration_s: float,
    max_tokens: int = 16,
    max_error_percent: float = 0.5,
    timeout: float = 120.0,
) -> LLMLoadReport:
    """Stream for ``duration_s`` with ``users`` clients (a request running at the end is
    finished and counted; none starts after)."""
    report = LLMLoadReport(users, duration_s, max_tokens, max_error_percent)
    requests = [
        (f"{t.prefix}/chat/completions", chat_body(n, stream=True, max_tokens=max_tokens))
        for t in targets
        for n in t.names
    ]
    limits = httpx.Limits(max_connections=users, max_keepalive_connections=users)
    started = time.monotonic()
    deadline = started + duration_s
    async with httpx.AsyncClient(
        base_url=gateway, timeout=timeout, limits=limits, trust_env=False
    ) as client:

        async def user(index: int) -> None:
            i = index
            while time.monotonic() < deadline:
                path, body = requests[i % len(requests)]
                i += 1
                await _one(client, path, body, report)

        await asyncio.gather(*(user(u) for u in range(users)))
    report.duration_s = time.monotonic() - started
    return report
