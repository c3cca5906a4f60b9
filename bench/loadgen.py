"""Load generation for the batching benchmark: KServe v2 clients and open/closed-loop drivers.

Open loop: arrivals follow a Poisson process fixed in advance, and each request's latency runs
from its *scheduled* send time, so a server (or a client pool) that falls behind shows up as
queueing delay instead of silently sending less (coordinated omission). Closed loop: N
clients each send their next request as soon as the last one answered, to find the most a
configuration serves. Drivers run in a worker process (``LoadWorker``) so the load generator
never shares an event loop with the server.

The clients live in ``loadgen_http`` and ``loadgen_grpc``, the drivers in ``loadgen_loops``;
this module picks a client, runs one ``LoadSpec`` and owns the worker process.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection

from loadgen_grpc import grpc_client, grpc_stream_client
from loadgen_http import http_client
from loadgen_loops import run_closed_loop, run_open_loop
from loadgen_spec import PROTOCOLS, LoadSpec, Send, request_row

__all__ = [
    "PROTOCOLS",
    "LoadSpec",
    "LoadWorker",
    "build_client",
    "run_closed_loop",
    "run_open_loop",
    "run_spec",
]


async def build_client(spec: LoadSpec) -> tuple[Send, Callable[[], Awaitable[None]]]:
    """A ``send()`` coroutine for ``spec.protocol`` (True on a well-formed 200/OK answer) and
    a ``close()``. Request bodies are encoded once: the benchmark measures the server."""
    row = request_row(spec.width, spec.seed)
    if spec.protocol == "grpc":
        return await grpc_client(spec, row)
    if spec.protocol == "grpc-stream":
        return await grpc_stream_client(spec, row)
    return await http_client(spec, row)


async def run_spec(spec: LoadSpec) -> dict:
    send, close = await build_client(spec)
    try:
        if spec.warmup_s > 0:  # open the connection pool, let the batcher see traffic
            if spec.kind == "open":
                await run_open_loop(send, spec.rate, spec.warmup_s, spec.seed + 1)
            else:
                await run_closed_loop(send, spec.concurrency, spec.warmup_s)
        if spec.kind == "open":
            return await run_open_loop(send, spec.rate, spec.duration_s, spec.seed)
        return await run_closed_loop(send, spec.concurrency, spec.duration_s)
    finally:
        await close()


def _worker_main(conn: Connection) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    while True:
        spec = conn.recv()
        if spec is None:
            return
        try:
            conn.send(asyncio.run(run_spec(spec)))
        except Exception as exc:
            conn.send({"failed": f"{type(exc).__name__}: {exc}"})


class LoadWorker:
    """A long-lived load-generator process: ``run(spec)`` blocks until the point is done."""

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_worker_main, args=(child,), daemon=True, name="loadgen")
        self._proc.start()
        child.close()

    @property
    def pid(self) -> int:
        assert self._proc.pid is not None
        return self._proc.pid

    def run(self, spec: LoadSpec) -> dict:
        self._conn.send(spec)
        result = self._conn.recv()
        if "failed" in result:
            raise RuntimeError(f"load point {spec} failed: {result['failed']}")
        return result

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._conn.send(None)
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
