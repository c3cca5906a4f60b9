"""A pipeline against the same chain called step by step: the three-model chain with two
parallel branches (``inferway.devtools.demo_pipelines``: embed -> left || right), served as
one pipeline request, and called by a client one model at a time (embed, then left, then
right), both through Envoy configured by inferway, on one backend.

Each target runs cold (every request's input is new: no cache hit) and with cache hits (the
inputs repeat from a pool of ``--pool`` warmed-up ones; the step-by-step client has no cache,
so the repeats change nothing for it). Targets run in rotated order each round (A B C D, B C
D A, ...) so the machine's drift hits them alike; the table shows medians over the rounds.
The load generator is a Python aiohttp client in its own process (``--concurrency`` closed
loops, keep-alive).

    .venv/bin/python bench/pipeline_bench.py                  # 4 rounds x 5 s per target
    .venv/bin/python bench/pipeline_bench.py --quick          # 2 rounds x 2 s
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import shutil
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from _common import environment, percentile, print_table, write_results
from gateway_overhead import start_envoy
from servers import ServerProcess, backend_server_main

__all__ = ["main"]

TARGETS = ("pipeline cold", "step by step cold", "pipeline cached", "step by step cached")
WIDTH = 32  # the chain's input width (CHAIN[0].sizes[0])


def client_main(
    base: str, target: str, concurrency: int, duration: float, pool: int, conn: Connection
) -> None:
    """The load generator (own process): ``concurrency`` closed loops on ``target``."""
    import aiohttp
    import numpy as np
    import uvloop

    rng = np.random.default_rng(0)
    repeated = [rng.standard_normal((1, WIDTH), dtype=np.float32) for _ in range(pool)]

    def body(model_input: Any) -> dict[str, Any]:
        data = np.asarray(model_input, dtype=np.float32)
        return {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": list(data.shape),
                    "data": data.ravel().tolist(),
                }
            ]
        }

    async def post(session: aiohttp.ClientSession, model: str, x: Any) -> dict[str, Any]:
        async with session.post(f"{base}/v2/models/{model}/infer", json=body(x)) as r:
            answer = await r.json()
            if r.status != 200:
                raise RuntimeError(f"{model}: {r.status} {answer}")
            return answer

    async def one(session: aiohttp.ClientSession, x: Any) -> None:
        if target.startswith("pipeline"):
            await post(session, "chain", x)
            return
        embed = await post(session, "chain_embed", x)
        (y,) = embed["outputs"]
        h = np.asarray(y["data"], dtype=np.float32).reshape(y["shape"])
        await post(session, "chain_left", h)
        await post(session, "chain_right", h)

    async def run() -> dict[str, Any]:
        latencies: list[float] = []
        errors = 0
        counter = 0
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as s:
            if target.endswith("cached"):
                for x in repeated:  # warm the cache (and the connections)
                    await one(s, x)
            deadline = time.perf_counter() + duration

            async def loop(seed: int) -> None:
                nonlocal errors, counter
                fresh = np.random.default_rng(1000 + seed)
                while (start := time.perf_counter()) < deadline:
                    counter += 1
                    if target.endswith("cached"):
                        x = repeated[counter % pool]
                    else:
                        x = fresh.standard_normal((1, WIDTH), dtype=np.float32)
                    try:
                        await one(s, x)
                    except (aiohttp.ClientError, RuntimeError):
                        errors += 1
                    latencies.append(time.perf_counter() - start)

            started = time.perf_counter()
            await asyncio.gather(*(loop(i) for i in range(concurrency)))
            elapsed = time.perf_counter() - started
        ms = [v * 1000 for v in latencies]
        return {
            "p50_ms": round(percentile(ms, 50), 3),
            "p99_ms": round(percentile(ms, 99), 3),
            "rps": round(len(ms) / elapsed, 1),
            "requests": len(ms),
            "errors": errors,
        }

    conn.send(uvloop.run(run()))


def run_client(
    base: str, target: str, args: argparse.Namespace, concurrency: int
) -> dict[str, Any]:
    context = mp.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(
        target=client_main,
        args=(base, target, concurrency, args.duration, args.pool, sender),
        daemon=True,
    )
    process.start()
    if not receiver.poll(args.duration + 120):
        process.kill()
        raise RuntimeError(f"the {target} client did not finish")
    result: dict[str, Any] = receiver.recv()
    process.join(10)
    return result


def write_repository(root: Path, scale: int) -> None:
    from inferway.devtools.demo_pipelines import write_chain_pipeline

    config = {
        "provider": "cpu",
        "intra_op_threads": 1,
        "batching": {"mode": "adaptive", "max_batch_size": 32},
    }
    write_chain_pipeline(root, config=config, scale=scale)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="inferway-pipeline-bench-"))
    write_repository(workdir / "models", args.scale)
    backend = ServerProcess(backend_server_main, (str(workdir / "models"),), metrics=True)
    envoy, xds, port = await start_envoy(backend.http_port, workdir / "envoy", 1)
    base = f"http://127.0.0.1:{port}"
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {
        t: {c: [] for c in args.concurrency} for t in TARGETS
    }
    try:
        for concurrency in args.concurrency:
            for round_ in range(args.rounds):
                order = TARGETS[round_ % len(TARGETS) :] + TARGETS[: round_ % len(TARGETS)]
                for target in order:
                    result = await asyncio.to_thread(run_client, base, target, args, concurrency)
                    runs[target][concurrency].append(result)
                    print(f"  c={concurrency} round {round_ + 1} {target}: {result}", flush=True)
    finally:
        await envoy.stop()
        await xds.stop(0)
        backend.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per target run")
    parser.add_argument("--rounds", type=int, default=4, help="rotated rounds")
    parser.add_argument(
        "--concurrency",
        type=lambda s: [int(v) for v in s.split(",")],
        default=[1, 8],
        help="closed loops, comma-separated (one table row per value)",
    )
    parser.add_argument("--pool", type=int, default=8, help="distinct inputs of the cached runs")
    parser.add_argument(
        "--scale", type=int, default=128, help="hidden-width multiplier of the models"
    )
    parser.add_argument("--quick", action="store_true", help="2 rounds x 2 s")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.rounds = 2.0, 2
    runs = asyncio.run(measure(args))
    summary: dict[str, dict[str, dict[str, float]]] = {}
    rows = []
    for concurrency in args.concurrency:
        for target in TARGETS:
            results = runs[target][concurrency]
            s = {
                "p50_ms": round(statistics.median(r["p50_ms"] for r in results), 2),
                "p99_ms": round(statistics.median(r["p99_ms"] for r in results), 2),
                "rps": round(statistics.median(r["rps"] for r in results), 1),
                "errors": sum(r["errors"] for r in results),
            }
            summary.setdefault(target, {})[str(concurrency)] = s
        for target in TARGETS:
            s = summary[target][str(concurrency)]
            base = summary[target.replace("pipeline", "step by step")][str(concurrency)]
            rows.append(
                [
                    concurrency,
                    target,
                    s["p50_ms"],
                    s["p99_ms"],
                    f"{s['rps']:,.0f}",
                    f"{base['p50_ms'] / s['p50_ms']:.2f}" if target.startswith("pipeline") else "",
                    f"{s['rps'] / base['rps']:.2f}" if target.startswith("pipeline") else "",
                    s["errors"],
                ]
            )
    print_table(
        f"Pipeline vs step by step through Envoy: {args.duration:g} s x {args.rounds} rotated "
        f"rounds, scale {args.scale}",
        ["conc", "target", "p50 ms", "p99 ms", "chains/s", "p50 gain", "rps gain", "errors"],
        rows,
    )
    path = write_results(
        "pipeline_bench",
        {
            "environment": environment(),
            "command": " ".join([sys.executable, *sys.argv]),
            "duration_s": args.duration,
            "rounds": args.rounds,
            "scale": args.scale,
            "pool": args.pool,
            "summary": summary,
            "runs": {t: {str(c): r for c, r in by_c.items()} for t, by_c in runs.items()},
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
