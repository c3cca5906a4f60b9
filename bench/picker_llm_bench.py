"""The endpoint picker on real engines, side by side with round robin and least request: real
Envoy, the gateway, and ``--engines`` llama.cpp servers (llama-cpp-python, the tests' tiny
model, prompt cache on and small, so a server holds only a few tenants' prompts). The picker
runs three ways: scoring, asked by Envoy over the default ``transport: http`` (``inferway
picker``) and over GAIE's ext_proc (``picker over ext_proc``), and ``process: envoy`` (the
prompt's prefix hashed in Envoy, Maglev with bounded load, and the engines the gateway's
scrape of their ``llamacpp:*`` metrics finds at ``queue_limit`` left out: ``picker in
Envoy``), and the scoring picker run in Envoy's Lua filter (``process: envoy, pick: score``:
``picker scored in Envoy``, each Envoy worker counting its own requests). The scoring pickers
count their own requests in flight (``metrics_path: null``); every picker has ``queue_limit:
4``.

Workload (shared prefix): ``--tenants`` tenants, each a ``--system-chars``-character system
prompt (about one token a character with the tiny model), short questions, ``--max-tokens``
streamed tokens, open-loop Poisson arrivals at ``--rate`` for ``--duration`` seconds; tenants
drawn uniformly. Each policy gets freshly started engines (empty caches) and the same arrival
trace, through an Envoy with ``--envoy-concurrency`` workers (1 by default, for every policy).
Reported: TTFT p50/p90 (first content chunk, measured by the client through Envoy), completion
tokens/s over the run, errors.

    .venv/bin/python bench/picker_llm_bench.py                 # 4 engines, 40 s per policy
    .venv/bin/python bench/picker_llm_bench.py --duration 10   # quicker

The default rate (14 req/s) is near what round robin sustains on these 2 cores: below it no
policy queues and every TTFT is a prompt's evaluation (at 4-11 req/s round robin's p90 was
0.21-0.49 s, the pickers' 0.19-0.24 s: cold prompts, one per tenant and engine); above it
round robin falls behind the arrivals. Throughput is the same for every policy at this rate.

This machine's cores are shared by the engines, Envoy, the gateway and the load generator:
read the figures as a comparison on one machine, not as engine speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # inferway, tests/ from here

import aiohttp
from _common import (
    add_choice_list,
    choice_list,
    environment,
    percentile,
    print_table,
    write_results,
)

from tests.envoy_process import free_port
from tests.llm_engine import LLMEngine, require_llm_engine, start_llm_engine, write_test_model
from tests.traffic_harness import TrafficGateway

POLICY = """
version: 1
listeners:
  - name: ingress
    port: {{listener_port}}
services:
  - name: llm
    endpoints: [{endpoints}]
    health_check:
      path: /v1/models
      interval: 1s
{extra}
routes:
  - name: chat
    match:
      path:
        prefix: /v1/
    backends:
      - service: llm
"""
POLICIES = {
    "round robin": "",
    "least request": "    load_balancing:\n      policy: least_request\n",
    "inferway picker": (
        "    picker:\n      listen: 127.0.0.1:{picker_port}\n"
        "      http_listen: 127.0.0.1:{http_port}\n      metrics_path: null\n"
        "      queue_limit: 4\n      timeout: 2s\n"
    ),
    "picker over ext_proc": (
        "    picker:\n      listen: 127.0.0.1:{picker_port}\n      transport: ext_proc\n"
        "      metrics_path: null\n      queue_limit: 4\n      timeout: 2s\n"
    ),
    "picker in Envoy": "    picker:\n      process: envoy\n      queue_limit: 4\n",
    "picker scored in Envoy": (
        "    picker:\n      process: envoy\n      pick: score\n      metrics_path: null\n"
        "      queue_limit: 4\n"
    ),
}


def trace(args: argparse.Namespace) -> list[tuple[float, int, int]]:
    rng = random.Random(args.seed)
    out, now, n = [], 0.0, 0
    while True:
        now += rng.expovariate(args.rate)
        if now > args.duration:
            return out
        out.append((now, rng.randrange(args.tenants), n))
        n += 1


async def one(
    session: aiohttp.ClientSession, url: str, system: str, question: str, max_tokens: int
) -> tuple[float | None, int, str]:
    body = {
        "model": "tiny",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    started = time.perf_counter()
    ttft: float | None = None
    tokens = 0
    try:
        async with session.post(url, json=body) as response:
            served = response.headers.get("x-inferway-replica", "")
            if response.status != 200:
                await response.read()
                return None, 0, served
            async for line in response.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                chunk = json.loads(line[6:])
                if chunk["choices"][0]["delta"].get("content"):
                    tokens += 1
                    if ttft is None:
                        ttft = time.perf_counter() - started
            return ttft, tokens, served
    except (aiohttp.ClientError, TimeoutError):
        return None, 0, ""


async def run_policy(name: str, args: argparse.Namespace, model: Path) -> dict[str, Any]:
    engines: list[LLMEngine] = []
    try:
        for _ in range(args.engines):
            engines.append(await asyncio.to_thread(
                start_llm_engine, model, n_ctx=4096, cache=True, cache_size=args.cache_bytes,
                verbose=False,
            ))  # fmt: skip
        endpoints = ", ".join(f'"127.0.0.1:{e.port}"' for e in engines)
        extra = POLICIES[name].format(picker_port=free_port(), http_port=free_port())
        policy = POLICY.format(endpoints=endpoints, extra=extra.rstrip("\n"))
        async with TrafficGateway(policy, [], envoy_concurrency=args.envoy_concurrency) as gw:
            url = f"{gw.url}/v1/chat/completions"
            systems = [
                (f"Tenant {t} policy: " + "be precise and kind. " * args.system_chars)[
                    : args.system_chars
                ]
                for t in range(args.tenants)
            ]
            timeout = aiohttp.ClientTimeout(total=120)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                for _ in range(50):  # until the engines pass Envoy's health checks
                    ttft, _, _ = await one(session, url, "warm", "up", 1)
                    if ttft is not None:
                        break
                    await asyncio.sleep(0.2)
                began = time.perf_counter()

                async def at(delay: float, tenant: int, n: int) -> tuple[float | None, int, str]:
                    await asyncio.sleep(max(0.0, began + delay - time.perf_counter()))
                    return await one(
                        session, url, systems[tenant], f"question {n}?", args.max_tokens
                    )

                results = await asyncio.gather(*(at(d, t, n) for d, t, n in trace(args)))
                elapsed = time.perf_counter() - began
            pickers = gw.gateway.pickers if gw.gateway is not None else None
            shown = pickers.status().get("llm", {}) if pickers is not None else {}
            left_out = [c for c in shown.get("changes", []) if c["left_out"]]
    finally:
        for engine in engines:
            engine.stop()
    ttfts = [r[0] for r in results if r[0] is not None]
    return {
        "requests": len(results),
        "errors": sum(r[0] is None for r in results),
        "ttft_p50_s": round(percentile(ttfts, 50), 4),
        "ttft_p90_s": round(percentile(ttfts, 90), 4),
        "tokens_per_s": round(sum(r[1] for r in results) / elapsed, 1),
        "left_out": len(left_out),  # process: envoy: replicas left out as saturated, times
        "per_engine": sorted(
            {r[2]: sum(1 for x in results if x[2] == r[2]) for r in results}.values()
        ),
    }


async def main_async(args: argparse.Namespace) -> None:
    require_llm_engine()
    with tempfile.TemporaryDirectory(prefix="picker-bench-") as directory:
        model = write_test_model(Path(directory))
        results: dict[str, Any] = {"environment": environment(), "settings": vars(args)}
        rows = []
        for name in args.policies:
            figures = await run_policy(name, args, model)
            results[name] = figures
            engines = "/".join(map(str, figures["per_engine"]))
            rows.append([name, figures["requests"], figures["errors"], figures["ttft_p50_s"],
                         figures["ttft_p90_s"], figures["tokens_per_s"], engines,
                         figures["left_out"]])  # fmt: skip
    print_table(
        f"{args.engines} llama.cpp engines, {args.tenants} tenants, {args.rate:g} req/s",
        [
            "policy",
            "requests",
            "errors",
            "TTFT p50 s",
            "TTFT p90 s",
            "tokens/s",
            "per engine",
            "left out",
        ],
        rows,
    )
    print(f"results: {write_results('picker_llm_bench', results)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--tenants", type=int, default=16)
    parser.add_argument("--system-chars", type=int, default=2000)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rate", type=float, default=14.0)
    parser.add_argument("--duration", type=float, default=40.0)
    parser.add_argument("--cache-bytes", type=int, default=6 << 20, help="prompt cache per engine")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--envoy-concurrency", type=int, default=1,
        help="Envoy's worker threads, for every policy (the scored-in-Envoy picker keeps its "
        "prefix index per worker; an LLM pool's request rate needs one)",
    )  # fmt: skip
    add_choice_list(parser, "--policies", list(POLICIES), "comma-separated, run in this order")
    args = parser.parse_args()
    args.policies = choice_list(parser, "--policies", args.policies, list(POLICIES))
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
