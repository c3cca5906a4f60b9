"""Feature routing's cost: the same request through the same Envoy to the same backend, on a
route with ``match.features`` (Envoy buffers the body and asks the feature router, an
external processor in the gateway process, before routing) and on a route without (the
feature router skipped for it), side by side in one run, at each concurrency.

The backend is a small aiohttp app in its own process (a 40-byte JSON answer); the client is
a Python aiohttp client in its own process posting a 2-row Open Inference Protocol body;
the gateway (control plane + feature router) runs here, Envoy under its supervisor. Targets
alternate for ``--rounds`` rounds of ``--duration`` seconds each. ``fallbacks`` counts
answers from the default route of the feature route's path: requests the feature router did
not answer within its timeout (Envoy then routes without features).

    .venv/bin/python bench/feature_routing_bench.py                  # c=1 and c=64, 5 s each
    .venv/bin/python bench/feature_routing_bench.py --quick          # 1 s each, one round
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
from gateway_overhead import backend_main, spawn_server, stop_server

from inferway.gateway.runtime import GatewayOptions, start_gateway

__all__ = ["main"]

POLICY = """\
version: 1
listeners:
  - name: bench
    port: {listener_port}
feature_router:
  port: {router_port}
services:
  - name: pool
    endpoints: ["127.0.0.1:{backend_port}"]
  - name: fallback
    endpoints: ["127.0.0.1:{backend_port}"]
routes:
  - name: featured
    match:
      path: {{prefix: /v2/models/featured/infer}}
      features:
        rows: {{min: 1, max: 4}}
        input_bytes: {{max: 65536}}
        fields: [{{path: parameters.priority, exact: high}}]
    backends: [{{service: pool}}]
  - name: featured-default      # taken when the feature router did not answer in time
    match:
      path: {{prefix: /v2/models/featured/infer}}
    backends: [{{service: fallback}}]
  - name: plain
    match:
      path: {{prefix: /v2/models/plain/infer}}
    backends: [{{service: pool}}]
"""

BODY = json.dumps(
    {
        "inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": [0.5] * 8}],
        "parameters": {"priority": "high"},
    }
).encode()
TARGETS = {"plain route": "/v2/models/plain/infer", "feature route": "/v2/models/featured/infer"}


def client_main(url: str, concurrency: int, duration: float, conn: Connection) -> None:
    """``concurrency`` keep-alive workers posting BODY for ``duration`` s; sends latencies."""

    async def run() -> dict[str, Any]:
        import aiohttp

        latencies: list[float] = []
        errors = fallbacks = 0
        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:
            deadline = time.perf_counter() + duration

            async def worker() -> None:
                nonlocal errors, fallbacks
                while time.perf_counter() < deadline:
                    started = time.perf_counter()
                    async with session.post(url, data=BODY) as response:
                        await response.read()
                        if response.status != 200:
                            errors += 1
                        elif response.headers.get("x-inferway-pool") == "fallback":
                            fallbacks += 1
                    latencies.append(time.perf_counter() - started)

            started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            elapsed = time.perf_counter() - started
        return {
            "latencies": latencies,
            "errors": errors,
            "fallbacks": fallbacks,
            "elapsed": elapsed,
        }

    conn.send(asyncio.run(run()))


def run_client(url: str, concurrency: int, duration: float) -> dict[str, Any]:
    context = mp.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=client_main, args=(url, concurrency, duration, sender))
    process.start()
    if not receiver.poll(duration + 60):
        process.kill()
        raise RuntimeError("the client did not report")
    result: dict[str, Any] = receiver.recv()
    process.join(5)
    return result


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    backend, backend_conn, backend_port = spawn_server(backend_main)
    listener_port = free_port()
    with tempfile.TemporaryDirectory(prefix="inferway-bench-") as workdir:
        policy = Path(workdir) / "policy.yaml"
        policy.write_text(
            POLICY.format(
                listener_port=listener_port, router_port=free_port(), backend_port=backend_port
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
            assert gateway.supervisor is not None
            if not await gateway.supervisor.wait_ready(30):
                raise RuntimeError("Envoy did not become ready")
            base = f"http://127.0.0.1:{listener_port}"
            for path in TARGETS.values():  # warm up, and check the routes answer
                await asyncio.to_thread(run_client, base + path, 1, 0.3)
            samples: dict[tuple[str, int], dict[str, Any]] = {}
            for concurrency in args.concurrency:
                for _ in range(args.rounds):
                    for name, path in TARGETS.items():
                        result = await asyncio.to_thread(
                            run_client, base + path, concurrency, args.duration
                        )
                        entry = samples.setdefault(
                            (name, concurrency),
                            {"latencies": [], "errors": 0, "fallbacks": 0, "elapsed": 0.0},
                        )
                        for key in ("latencies", "errors", "fallbacks", "elapsed"):
                            entry[key] += result[key]
            assert gateway.features is not None and gateway.features.router is not None
            routed = gateway.features.router.processor.requests
        finally:
            await gateway.stop()
            stop_server(backend, backend_conn)
    rows = []
    for (name, concurrency), entry in samples.items():
        summary = summarize(entry["latencies"])
        rows.append(
            {
                "target": name,
                "concurrency": concurrency,
                **summary,
                "errors": entry["errors"],
                "fallbacks": entry["fallbacks"],
                "rps": round(len(entry["latencies"]) / entry["elapsed"], 1),
            }
        )
    for row in rows:
        plain = next(
            r
            for r in rows
            if r["target"] == "plain route" and r["concurrency"] == row["concurrency"]
        )
        row["added_p50_ms"] = round(row["p50_ms"] - plain["p50_ms"], 3)
        row["added_p99_ms"] = round(row["p99_ms"] - plain["p99_ms"], 3)
    return {"rows": rows, "feature_router_requests": routed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="1 s per target, one round")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.rounds = 1.0, 1
    result = asyncio.run(measure(args))
    columns = ["target", "c", "p50 ms", "p99 ms", "req/s", "errors", "fallbacks", "+p50", "+p99"]
    print_table(
        "feature routing vs the same route without features",
        columns,
        [
            [
                r["target"],
                r["concurrency"],
                r["p50_ms"],
                r["p99_ms"],
                r["rps"],
                r["errors"],
                r["fallbacks"],
                r["added_p50_ms"],
                r["added_p99_ms"],
            ]
            for r in result["rows"]
        ],
    )
    path = write_results(
        "feature_routing",
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
