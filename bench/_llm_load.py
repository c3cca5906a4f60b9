"""The streaming load generator of bench/llm_stream.py, run in its own process (spawned) so its
CPU is not the measured targets': N concurrent streamed chat completions (closed loop) or
Poisson arrivals at a rate with a cap on streams in flight (open loop).

Per stream it records the time to first token (from the moment the request was due, so a
slow target's queueing is counted, not hidden: no coordinated omission), every gap between
tokens (ITL) and the tokens received. A stream is an error when the status is not 200, the
connection fails, it ends without ``data: [DONE]`` or brings no token; in the open loop an
arrival that finds the cap full is shed and counted as an error too.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["LoadSpec", "load_main", "quantile"]

LoadSpec = dict[str, Any]
"""url, model, headers, mode (closed|open), concurrency, rate, duration, max_tokens, seed."""


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile (q in [0, 1]); NaN without values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered), max(1, math.ceil(q * len(ordered)))) - 1]


class _Run:
    def __init__(self, spec: LoadSpec) -> None:
        self.spec = spec
        self.ttft: list[float] = []
        self.itl: list[float] = []
        self.tokens_in_window = 0
        self.tokens = 0
        self.completed = 0
        self.errors = 0
        self.error_kinds: dict[str, int] = {}
        self.deadline = 0.0
        self.body = {
            "model": spec["model"],
            "messages": [{"role": "user", "content": "Say something about gateways, please."}],
            "stream": True,
            "max_tokens": spec["max_tokens"],
            "stream_options": {"include_usage": True},
        }

    def _error(self, kind: str) -> None:
        self.errors += 1
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1

    async def stream(self, session: Any, due: float) -> None:
        import orjson

        tokens, last, done = 0, 0.0, False
        try:
            async with session.post(
                self.spec["url"], json=self.body, headers=self.spec["headers"]
            ) as response:
                if response.status != 200:
                    await response.read()
                    self._error(f"HTTP {response.status}")
                    return
                async for line in response.content:
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        break
                    if b"content" not in data:
                        continue
                    chunk = orjson.loads(data)
                    choices = chunk.get("choices") or []
                    if not choices or not (choices[0].get("delta") or {}).get("content"):
                        continue
                    now = time.perf_counter()
                    if tokens == 0:
                        self.ttft.append(now - due)
                    else:
                        self.itl.append(now - last)
                    last = now
                    tokens += 1
                    self.tokens += 1
                    if now <= self.deadline:
                        self.tokens_in_window += 1
        except Exception as exc:  # a failed stream is a measurement, not a crash
            self._error(type(exc).__name__)
            return
        if not done:
            self._error("no [DONE]")
        elif tokens == 0:
            self._error("no token")
        else:
            self.completed += 1

    async def closed(self, session: Any, start: float) -> None:
        async def user() -> None:
            while (due := time.perf_counter()) < self.deadline:
                await self.stream(session, due)

        await asyncio.gather(*(user() for _ in range(self.spec["concurrency"])))
        del start

    async def open(self, session: Any, start: float) -> None:
        rng = random.Random(self.spec["seed"])
        in_flight: set[asyncio.Task[None]] = set()
        due = start
        while True:
            due += rng.expovariate(self.spec["rate"])
            if due >= self.deadline:
                break
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            if len(in_flight) >= self.spec["concurrency"]:
                self._error("shed: cap full")
                continue
            task = asyncio.create_task(self.stream(session, due))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        if in_flight:
            await asyncio.gather(*in_flight)

    def summary(self, wall: float) -> dict[str, Any]:
        duration = self.spec["duration"]
        ms = 1000.0
        return {
            "streams": self.completed + self.errors,
            "completed": self.completed,
            "errors": self.errors,
            "error_kinds": self.error_kinds,
            "ttft_p50_ms": quantile(self.ttft, 0.5) * ms,
            "ttft_p99_ms": quantile(self.ttft, 0.99) * ms,
            "itl_p50_ms": quantile(self.itl, 0.5) * ms,
            "itl_p99_ms": quantile(self.itl, 0.99) * ms,
            "tokens_per_s": self.tokens_in_window / duration,
            "tokens": self.tokens,
            "requests_per_s": self.completed / wall,
            "wall_s": wall,
        }


async def _load(spec: LoadSpec) -> dict[str, Any]:
    import aiohttp

    run = _Run(spec)
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=60)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, trust_env=False
    ) as session:
        start = time.perf_counter()
        run.deadline = start + spec["duration"]
        await (run.closed(session, start) if spec["mode"] == "closed" else run.open(session, start))
        return run.summary(time.perf_counter() - start)


def load_main(spec: LoadSpec, conn: Connection) -> None:
    """Runs one load and sends its summary on ``conn``."""
    import uvloop

    conn.send(uvloop.run(_load(spec)))
