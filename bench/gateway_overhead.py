"""Gateway overhead: latency and throughput straight to a backend, through Envoy (configured
by inferway), and through a plain aiohttp reverse proxy, side by side in one run.

The backend is a small, fast aiohttp app (uvloop, a 40-byte JSON answer) in its own process,
so what is measured is the hop, not a model. The load generator is ``wrk`` (``--client
wrk``, the default when installed: C, keep-alive, fixed concurrency) or a Python aiohttp
client in a separate process (``--client python``). Envoy runs with ``--envoy-concurrency``
workers (default 1: the aiohttp proxy is one process too). Targets run in turn, ``--rounds``
times interleaved, each for ``--duration`` seconds at ``--concurrency`` connections.

    .venv/bin/python bench/gateway_overhead.py                        # 10 s each, 32 conns
    .venv/bin/python bench/gateway_overhead.py --quick                # 3 s each
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import re
import shutil
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from _aiohttp_proxy import proxy_main
from _common import environment, free_port, percentile, print_table, write_results

from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.supervisor import EnvoySupervisor
from inferway.policies import load_policy_text
from inferway.xds.bootstrap import build_bootstrap
from inferway.xds.cache import SnapshotCache
from inferway.xds.server import start_xds_server

__all__ = ["main"]

BODY = b'{"model":"bench","outputs":[0.125,0.875]}'


def backend_main(conn: Connection) -> None:
    """The fast backend: every path answers BODY; reports its port, stops when told."""
    import uvloop
    from aiohttp import web

    async def run() -> None:
        async def answer(_request: web.Request) -> web.Response:
            return web.Response(body=BODY, content_type="application/json")

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", answer)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        conn.send(runner.addresses[0][1])
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        await runner.cleanup()

    uvloop.run(run())


# -- load generators ----------------------------------------------------------------------------


_WRK_LATENCY = re.compile(r"^\s*(50|99)%\s+([\d.]+)(us|ms|s)\s*$", re.M)
_UNIT_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def run_wrk(url: str, concurrency: int, duration: float) -> dict[str, Any]:
    command = [
        "wrk",
        "-t1",
        f"-c{concurrency}",
        f"-d{max(1, round(duration))}s",
        "--latency",
        url,
    ]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    latency = {q: float(v) * _UNIT_MS[u] for q, v, u in _WRK_LATENCY.findall(output)}
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
    requests = int(re.search(r"(\d+) requests in", output).group(1))  # type: ignore[union-attr]
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    socket_errors = re.search(r"Socket errors: (.*)", output)
    return {
        "p50_ms": round(latency["50"], 3),
        "p99_ms": round(latency["99"], 3),
        "rps": round(rps, 1),
        "requests": requests,
        "errors": int(non_2xx.group(1)) if non_2xx else 0,
        "socket_errors": socket_errors.group(1) if socket_errors else "",
    }


def python_client_main(url: str, concurrency: int, duration: float, conn: Connection) -> None:
    """The Python load generator (separate process): ``concurrency`` keep-alive workers."""
    import aiohttp
    import uvloop

    async def run() -> dict[str, Any]:
        latencies: list[float] = []
        errors = 0
        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:
            deadline = time.perf_counter() + duration

            async def worker() -> None:
                nonlocal errors
                while (start := time.perf_counter()) < deadline:
                    try:
                        async with session.get(url) as response:
                            await response.read()
                            if response.status != 200:
                                errors += 1
                    except aiohttp.ClientError:
                        errors += 1
                    latencies.append(time.perf_counter() - start)

            started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            elapsed = time.perf_counter() - started
        ms = [v * 1000 for v in latencies]
        return {
            "p50_ms": round(percentile(ms, 50), 3),
            "p99_ms": round(percentile(ms, 99), 3),
            "rps": round(len(ms) / elapsed, 1),
            "requests": len(ms),
            "errors": errors,
            "socket_errors": "",
        }

    conn.send(uvloop.run(run()))


def run_python_client(url: str, concurrency: int, duration: float) -> dict[str, Any]:
    context = mp.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(
        target=python_client_main, args=(url, concurrency, duration, sender), daemon=True
    )
    process.start()
    result = receiver.recv()
    process.join(10)
    return result


# -- the targets --------------------------------------------------------------------------------


def spawn_server(target: Any, *args: Any) -> tuple[mp.process.BaseProcess, Connection, int]:
    context = mp.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=target, args=(*args, child), daemon=True)
    process.start()
    if not parent.poll(30):
        process.kill()
        raise RuntimeError(f"{target.__name__} did not start")
    return process, parent, int(parent.recv())


def stop_server(process: mp.process.BaseProcess, conn: Connection) -> None:
    conn.send("stop")
    process.join(5)
    if process.is_alive():
        process.kill()


POLICY = """\
version: 1
listeners:
  - {{name: bench, port: {listener_port}}}
services:
  - name: backend
    endpoints: ["127.0.0.1:{backend_port}"]
routes:
  - name: all
    backends: [{{service: backend}}]
"""


async def start_envoy(
    backend_port: int, workdir: Path, concurrency: int
) -> tuple[EnvoySupervisor, Any, int]:
    listener_port = free_port()
    text = POLICY.format(listener_port=listener_port, backend_port=backend_port)
    cache = SnapshotCache()
    ControlPlane(cache).apply_policy(load_policy_text(text, "bench-policy.yaml"), "bench")
    server = await start_xds_server(cache)
    bootstrap = build_bootstrap(node_id="bench", xds_port=server.port, admin_port=free_port())
    envoy = EnvoySupervisor(bootstrap, workdir=workdir, log_level="error", concurrency=concurrency)
    await envoy.start()
    if not await envoy.wait_ready(30):
        await envoy.stop()
        await server.stop(0)
        raise RuntimeError("Envoy did not become ready")
    return envoy, server, listener_port


async def wait_answers(url: str, timeout: float = 10.0) -> None:
    import aiohttp

    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(url) as response:
                    if response.status == 200 and await response.read() == BODY:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} does not answer")
            await asyncio.sleep(0.05)


async def measure(args: argparse.Namespace, client: str) -> dict[str, Any]:
    load = run_wrk if client == "wrk" else run_python_client
    backend, backend_conn, backend_port = spawn_server(backend_main)
    proxy, proxy_conn, proxy_port = spawn_server(proxy_main, backend_port)
    workdir = Path(tempfile.mkdtemp(prefix="inferway-bench-"))
    envoy, xds, envoy_port = await start_envoy(backend_port, workdir, args.envoy_concurrency)
    targets = {
        "direct": f"http://127.0.0.1:{backend_port}/v2/models/bench/infer",
        "envoy (inferway)": f"http://127.0.0.1:{envoy_port}/v2/models/bench/infer",
        "aiohttp proxy": f"http://127.0.0.1:{proxy_port}/v2/models/bench/infer",
    }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
    try:
        for url in targets.values():
            await wait_answers(url)
            load(url, args.concurrency, 1.0)  # warm-up: connections, JIT-free but caches
        for _ in range(args.rounds):
            for name, url in targets.items():
                # wrk/the client process block; the event loop only serves xDS meanwhile
                result = await asyncio.to_thread(load, url, args.concurrency, args.duration)
                runs[name].append(result)
    finally:
        await envoy.stop()
        await xds.stop(0)
        stop_server(proxy, proxy_conn)
        stop_server(backend, backend_conn)
        shutil.rmtree(workdir, ignore_errors=True)
    return runs


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per target run")
    parser.add_argument("--concurrency", type=int, default=32, help="open connections")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds")
    parser.add_argument("--envoy-concurrency", type=int, default=1, help="Envoy worker threads")
    parser.add_argument("--client", choices=["auto", "wrk", "python"], default="auto")
    parser.add_argument("--quick", action="store_true", help="3 s per target")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration = 3.0
    client = args.client
    if client == "auto":
        client = "wrk" if shutil.which("wrk") else "python"
    runs = asyncio.run(measure(args, client))
    summary: dict[str, dict[str, float]] = {}
    for name, results in runs.items():
        summary[name] = {
            "p50_ms": _median([r["p50_ms"] for r in results]),
            "p99_ms": _median([r["p99_ms"] for r in results]),
            "rps": _median([r["rps"] for r in results]),
            "errors": sum(r["errors"] for r in results),
        }
    direct = summary["direct"]
    rows = [
        [
            name,
            s["p50_ms"],
            s["p99_ms"],
            f"{s['rps']:,.0f}",
            f"{s['rps'] / direct['rps']:.2f}",
            f"{s['p50_ms'] - direct['p50_ms']:+.3f}" if name != "direct" else "",
            s["errors"],
        ]
        for name, s in summary.items()
    ]
    print_table(
        f"Gateway overhead: {args.concurrency} connections, {args.duration:g} s x {args.rounds}, "
        f"load from {client}, Envoy workers {args.envoy_concurrency}",
        ["target", "p50 ms", "p99 ms", "req/s", "vs direct", "added p50 ms", "errors"],
        rows,
    )
    path = write_results(
        "gateway_overhead",
        {
            "environment": environment(),
            "command": " ".join([sys.executable, *sys.argv]),
            "client": client,
            "concurrency": args.concurrency,
            "duration_s": args.duration,
            "rounds": args.rounds,
            "envoy_concurrency": args.envoy_concurrency,
            "summary": summary,
            "runs": runs,
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
