"""What each transport costs the server before any inference: CPU per request of a bare
handler that returns a canned answer, over aiohttp (HTTP/1.1 keep-alive), grpc.aio unary
calls, grpcio's thread-pool (sync) server's unary calls and grpc.aio bidirectional-stream
messages. This is the floor under the backend's own
per-request cost, and why its gRPC cannot be cheaper than its HTTP in one Python process.

Each server runs alone in a child process; the load is the batching benchmark's load
generator (closed loop, 16 clients) in this process; the figure is the server process's CPU
seconds divided by the requests it answered.

    .venv/bin/python bench/transport_floor.py --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import time
from multiprocessing.connection import Connection
from typing import Any

import psutil
from _common import environment, free_port, print_table, write_results
from loadgen import LoadSpec, run_spec

__all__ = ["main"]

TRANSPORTS = ("http", "grpc", "grpc-sync", "grpc-stream")
_PROTOCOL = {
    "http": "http-binary",
    "grpc": "grpc",
    "grpc-sync": "grpc",
    "grpc-stream": "grpc-stream",
}


def _serve(transport: str, port: int, conn: Connection) -> None:
    import grpc
    import uvloop
    from aiohttp import web

    from inferway.backends.protocol import pb2, pb2_grpc

    answer = pb2.ModelInferResponse(model_name="m", model_version="1")
    answer.outputs.add(name="y", datatype="FP32", shape=[1, 10])
    answer.raw_output_contents.append(bytes(40))
    body = (
        b'{"model_name":"m","outputs":'
        b'[{"name":"y","datatype":"FP32","shape":[1,10],"data":[0,0,0,0,0,0,0,0,0,0]}]}'
    )

    class Bare(pb2_grpc.GRPCInferenceServiceServicer):
        async def ModelInfer(self, request: Any, context: Any) -> Any:
            return answer

        async def ModelStreamInfer(self, requests: Any, context: Any) -> Any:
            async for request in requests:
                yield pb2.ModelStreamInferResponse(
                    infer_response=pb2.ModelInferResponse(model_name="m", id=request.id)
                )

    if transport == "grpc-sync":
        from concurrent.futures import ThreadPoolExecutor

        class BareSync(pb2_grpc.GRPCInferenceServiceServicer):
            def ModelInfer(self, request: Any, context: Any) -> Any:
                return answer

        sync_server = grpc.server(ThreadPoolExecutor(max_workers=16))
        pb2_grpc.add_GRPCInferenceServiceServicer_to_server(BareSync(), sync_server)
        sync_server.add_insecure_port(f"127.0.0.1:{port}")
        sync_server.start()
        conn.send("ready")
        conn.recv()
        sync_server.stop(0)
        return

    async def main() -> None:
        if transport == "http":

            async def infer(request: web.Request) -> web.Response:
                await request.read()
                return web.Response(body=body, content_type="application/json")

            app = web.Application()
            app.router.add_post("/v2/models/m/infer", infer)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
        else:
            server = grpc.aio.server()
            pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Bare(), server)
            server.add_insecure_port(f"127.0.0.1:{port}")
            await server.start()
        conn.send("ready")
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)

    uvloop.run(main())


def measure(transport: str, seconds: float) -> dict[str, Any]:
    port = free_port()
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(transport, port, child), daemon=True)
    proc.start()
    if not parent.poll(60) or parent.recv() != "ready":
        proc.kill()
        raise RuntimeError(f"{transport} server did not start")
    server = psutil.Process(proc.pid)
    spec = LoadSpec(
        protocol=_PROTOCOL[transport],
        host="127.0.0.1",
        http_port=port,
        grpc_port=port,
        model="m",
        width=256,
        kind="closed",
        duration_s=seconds,
        concurrency=16,
        warmup_s=0.5,
    )
    try:
        cpu0 = sum(server.cpu_times()[:2])
        began = time.perf_counter()
        raw = asyncio.run(run_spec(spec))
        elapsed = time.perf_counter() - began
        cpu = sum(server.cpu_times()[:2]) - cpu0
    finally:
        parent.send("stop")
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    answered = len(raw["latencies_s"])
    if raw["errors"]:
        raise RuntimeError(f"{transport}: {len(raw['errors'])} failed requests")
    # The warm-up's requests ran on the server too: spread its CPU over all of them.
    total = answered * (elapsed / raw["elapsed_s"])
    return {
        "transport": transport,
        "requests": answered,
        "rps": answered / raw["elapsed_s"],
        "server_cpu_us_per_request": cpu / total * 1e6,
        "client_cpu_us_per_request": raw["client_cpu_s"] / answered * 1e6,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=5.0, help="load per transport")
    args = p.parse_args(argv)
    rows = [measure(t, args.seconds) for t in TRANSPORTS]
    print_table(
        "bare handlers: server CPU per request (closed loop, 16 clients)",
        ["transport", "requests", "req/s", "server CPU µs/req", "client CPU µs/req"],
        [
            [
                r["transport"],
                r["requests"],
                f"{r['rps']:.0f}",
                f"{r['server_cpu_us_per_request']:.0f}",
                f"{r['client_cpu_us_per_request']:.0f}",
            ]
            for r in rows
        ],
    )
    path = write_results("transport_floor", {"environment": environment(), "rows": rows})
    print(f"wrote {path}")
    return {"rows": rows}


if __name__ == "__main__":
    main()
