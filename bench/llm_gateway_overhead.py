"""The LLM gateway's overhead on streamed chat completions: time to first token (TTFT) and
tokens/s straight to an OpenAI-style engine, through Envoy on a plain route (no external
processor), and through Envoy on an ``openai`` route (the LLM processor reads the body,
rewrites it for ``include_usage``; Envoy's Lua filter counts the answer's chunks, drops the
usage chunk and reports once per stream), side by side in one run at each concurrency; plus
the processor's CPU per request and per token.

The engine is a small aiohttp SSE server in its own process (``--first-token-ms`` before the
first chunk, ``--token-ms`` between chunks, ``--tokens`` chunks); the client is a Python
aiohttp client in its own process (TTFT: until the first chunk with content arrives); the
gateway (control plane + LLM processor) runs here, Envoy under its supervisor. Targets
alternate for ``--rounds`` rounds of ``--duration`` seconds each.

    .venv/bin/python bench/llm_gateway_overhead.py                  # c=1, 16, 100; 5 s each
    .venv/bin/python bench/llm_gateway_overhead.py --quick          # 2 s each, one round
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from _common import environment, free_port, print_table, summarize, write_results
from gateway_overhead import spawn_server, stop_server

from inferway.gateway.runtime import GatewayOptions, start_gateway

__all__ = ["main"]

POLICY = """\
version: 1
listeners:
  - name: bench
    port: {listener_port}
llm:
  port: {llm_port}
services:
  - name: engine
    endpoints: ["127.0.0.1:{engine_port}"]
routes:
  - name: llm
    openai:
      model: bench
    backends: [{{service: engine}}]
  - name: plain
    match:
      path: {{prefix: /plain/}}
    backends: [{{service: engine}}]
"""
TARGETS = {
    "direct": "{engine}/v1/chat/completions",
    "envoy, plain route": "{gateway}/plain/v1/chat/completions",
    "envoy + LLM processor": "{gateway}/v1/chat/completions",
}
BODY = json.dumps(
    {"model": "bench", "stream": True, "messages": [{"role": "user", "content": "hello " * 64}]}
).encode()


def engine_main(first_token_s: float, token_s: float, tokens: int, conn: Connection) -> None:
    """An OpenAI-style SSE engine: ``tokens`` chunks, usage last when asked for."""
    import uvloop
    from aiohttp import web

    async def run() -> None:
        async def answer(request: web.Request) -> web.StreamResponse:
            document = json.loads(await request.read())
            response = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await response.prepare(request)
            await asyncio.sleep(first_token_s)
            for i in range(tokens):
                if i:
                    await asyncio.sleep(token_s)
                chunk = {"model": "bench", "choices": [{"index": 0, "delta": {"content": "tok "}}]}
                await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            if (document.get("stream_options") or {}).get("include_usage"):
                usage = {"prompt_tokens": 64, "completion_tokens": tokens}
                last = {"model": "bench", "choices": [], "usage": usage}
                await response.write(b"data: " + json.dumps(last).encode() + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response

        app = web.Application()
        app.router.add_route("POST", "/{tail:.*}", answer)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        conn.send(runner.addresses[0][1])
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        await runner.cleanup()

    uvloop.run(run())


def client_main(url: str, concurrency: int, duration: float, conn: Connection) -> None:
    """``concurrency`` streams at a time for ``duration`` s; sends TTFTs and token counts."""

    async def run() -> dict[str, Any]:
        import aiohttp

        ttfts: list[float] = []
        tokens = errors = usage_seen = 0
        connector = aiohttp.TCPConnector(limit=concurrency)
        headers = {"content-type": "application/json"}
        async with aiohttp.ClientSession(connector=connector) as session:
            deadline = time.perf_counter() + duration

            async def worker() -> None:
                nonlocal tokens, errors, usage_seen
                while time.perf_counter() < deadline:
                    started = time.perf_counter()
                    first: float | None = None
                    async with session.post(url, data=BODY, headers=headers) as response:
                        if response.status != 200:
                            errors += 1
                            await response.read()
                            continue
                        async for line in response.content:
                            if line.startswith(b"data: {"):
                                if b'"usage"' in line:
                                    usage_seen += 1
                                    continue
                                if first is None:
                                    first = time.perf_counter() - started
                                tokens += 1
                    if first is not None:
                        ttfts.append(first)

            started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            elapsed = time.perf_counter() - started
        return {
            "ttfts": ttfts,
            "tokens": tokens,
            "errors": errors,
            "usage_seen": usage_seen,
            "elapsed": elapsed,
        }

    conn.send(asyncio.run(run()))


def run_client(url: str, concurrency: int, duration: float) -> dict[str, Any]:
    context = mp.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=client_main, args=(url, concurrency, duration, sender))
    process.start()
    if not receiver.poll(duration + 120):
        process.kill()
        raise RuntimeError("the client did not report")
    result: dict[str, Any] = receiver.recv()
    process.join(5)
    return result


def _cpu_s(pid: int | None) -> float:
    """A process's user+system CPU seconds (Linux /proc)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    import os

    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    engine, engine_conn, engine_port = spawn_server(
        engine_main, args.first_token_ms / 1000, args.token_ms / 1000, args.tokens
    )
    listener_port = free_port()
    samples: dict[tuple[str, int], dict[str, Any]] = {}
    cpu: dict[str, float] = {"processor_s": 0.0}
    with tempfile.TemporaryDirectory(prefix="inferway-bench-") as workdir:
        policy = Path(workdir) / "policy.yaml"
        policy.write_text(
            POLICY.format(
                listener_port=listener_port, llm_port=free_port(), engine_port=engine_port
            )
        )
        gateway = await start_gateway(
            GatewayOptions(
                policy_path=policy,
                xds_port=0,
                admin_port=0,
                envoy_admin_port=free_port(),
                workdir=Path(workdir) / "gw",
                envoy_log_level="error",
                envoy_concurrency=1,
            )
        )
        try:
            assert gateway.supervisor is not None and gateway.llm is not None
            if not await gateway.supervisor.wait_ready(30):
                raise RuntimeError("Envoy did not become ready")
            urls = {
                name: template.format(
                    engine=f"http://127.0.0.1:{engine_port}",
                    gateway=f"http://127.0.0.1:{listener_port}",
                )
                for name, template in TARGETS.items()
            }
            for url in urls.values():  # warm up, and check every target answers
                await asyncio.to_thread(run_client, url, 1, 0.3)
            # the idle CPU of both (health checks, stats, the control plane) is not the traffic's
            idle = time.perf_counter(), time.process_time(), _cpu_s(gateway.supervisor.pid)
            await asyncio.sleep(3.0)
            span = time.perf_counter() - idle[0]
            idle_rate = (
                (time.process_time() - idle[1]) / span,
                (_cpu_s(gateway.supervisor.pid) - idle[2]) / span,
            )
            cpu["idle_processor_cpu_per_s"], cpu["idle_envoy_cpu_per_s"] = idle_rate
            for concurrency in args.concurrency:
                for _ in range(args.rounds):
                    for name, url in urls.items():
                        started = time.perf_counter()
                        cpu_before = time.process_time(), _cpu_s(gateway.supervisor.pid)
                        result = await asyncio.to_thread(
                            run_client, url, concurrency, args.duration
                        )
                        wall = time.perf_counter() - started
                        if name == "envoy + LLM processor":
                            spent = time.process_time() - cpu_before[0]
                            cpu["processor_s"] += max(0.0, spent - idle_rate[0] * wall)
                        envoy_s = _cpu_s(gateway.supervisor.pid) - cpu_before[1]
                        envoy_s = max(0.0, envoy_s - idle_rate[1] * wall)
                        cpu[f"envoy_s: {name}"] = cpu.get(f"envoy_s: {name}", 0.0) + envoy_s
                        entry = samples.setdefault(
                            (name, concurrency),
                            {
                                "ttfts": [],
                                "tokens": 0,
                                "errors": 0,
                                "usage_seen": 0,
                                "elapsed": 0.0,
                            },
                        )
                        entry["ttfts"] += result["ttfts"]
                        for key in ("tokens", "errors", "usage_seen", "elapsed"):
                            entry[key] += result[key]
            processed = gateway.llm.processor.requests
        finally:
            await gateway.stop()
            stop_server(engine, engine_conn)
    return _report(samples, cpu, processed)


def _report(
    samples: dict[tuple[str, int], dict[str, Any]], cpu: dict[str, float], processed: int
) -> dict[str, Any]:
    rows = []
    for (name, concurrency), entry in samples.items():
        summary = summarize(entry["ttfts"])
        rows.append(
            {
                "target": name,
                "concurrency": concurrency,
                "streams": summary.get("count", 0),
                "ttft_p50_ms": summary.get("p50_ms"),
                "ttft_p99_ms": summary.get("p99_ms"),
                "tokens_per_s": round(entry["tokens"] / entry["elapsed"], 1),
                "errors": entry["errors"],
                "usage_chunks_seen": entry["usage_seen"],
            }
        )
    for row in rows:
        direct = next(
            r for r in rows if r["target"] == "direct" and r["concurrency"] == row["concurrency"]
        )
        row["added_ttft_p50_ms"] = round(row["ttft_p50_ms"] - direct["ttft_p50_ms"], 3)
        row["added_ttft_p99_ms"] = round(row["ttft_p99_ms"] - direct["ttft_p99_ms"], 3)
    through = [s for (name, _), s in samples.items() if name == "envoy + LLM processor"]
    streams = sum(len(s["ttfts"]) for s in through) or 1
    tokens = sum(s["tokens"] for s in through) or 1
    for name in TARGETS:
        if name != "direct":
            done = sum(len(s["ttfts"]) for (n, _), s in samples.items() if n == name) or 1
            cpu[f"envoy_cpu_ms_per_stream: {name}"] = round(
                cpu.get(f"envoy_s: {name}", 0.0) * 1000 / done, 3
            )
    per = {
        "processor_cpu_ms_per_stream": round(cpu["processor_s"] * 1000 / streams, 3),
        "processor_cpu_us_per_token": round(cpu["processor_s"] * 1e6 / tokens, 1),
        "processor_streams": processed,
    }
    return {"rows": rows, "cpu": {**cpu, **per}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 100])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--first-token-ms", type=float, default=20.0)
    parser.add_argument("--token-ms", type=float, default=5.0)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--quick", action="store_true", help="2 s per target, one round")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.rounds = 2.0, 1
    result = asyncio.run(measure(args))
    columns = ["target", "c", "streams", "TTFT p50", "TTFT p99", "+p50", "+p99", "tok/s", "err"]
    print_table(
        "streamed chat completions: TTFT (ms) and tokens/s, direct vs through the gateway",
        columns,
        [
            [
                r["target"],
                r["concurrency"],
                r["streams"],
                r["ttft_p50_ms"],
                r["ttft_p99_ms"],
                r["added_ttft_p50_ms"],
                r["added_ttft_p99_ms"],
                r["tokens_per_s"],
                r["errors"],
            ]
            for r in result["rows"]
        ],
    )
    cpu = result["cpu"]
    print(
        f"LLM processor CPU (the gateway process): {cpu['processor_cpu_ms_per_stream']} ms per "
        f"stream, {cpu['processor_cpu_us_per_token']} us per token"
    )
    for name in TARGETS:
        key = f"envoy_cpu_ms_per_stream: {name}"
        if key in cpu:
            print(f"Envoy CPU, {name}: {cpu[key]} ms per stream")
    path = write_results(
        "llm_gateway_overhead",
        {
            **result,
            "args": {k: str(v) for k, v in vars(args).items()},
            "environment": environment(),
        },
        args.output,
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
