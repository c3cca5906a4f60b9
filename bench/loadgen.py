"""Load generation for the batching benchmark: KServe v2 clients and open/closed-loop drivers.

Open loop: arrivals follow a Poisson process fixed in advance, and each request's latency runs
from its *scheduled* send time, so a server (or a client pool) that falls behind shows up as
queueing delay instead of silently sending less (coordinated omission). Closed loop: N
clients each send their next request as soon as the last one answered, to find the most a
configuration serves. Drivers run in a worker process (``LoadWorker``) so the load generator
never shares an event loop with the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import multiprocessing as mp
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

__all__ = [
    "PROTOCOLS",
    "LoadSpec",
    "LoadWorker",
    "build_client",
    "run_closed_loop",
    "run_open_loop",
]

PROTOCOLS = ("http-json", "http-binary", "grpc", "grpc-stream")
REQUEST_TIMEOUT_S = 10.0
HTTP_POOL = 256
GRPC_CHANNELS = 4


@dataclass(frozen=True)
class LoadSpec:
    """One measurement point, sent to a worker process."""

    protocol: str
    host: str
    http_port: int
    grpc_port: int
    model: str
    width: int  # input features; every request is one row
    kind: str  # "open" | "closed"
    duration_s: float
    rate: float = 0.0  # open loop: mean requests/s
    concurrency: int = 1  # closed loop: clients
    warmup_s: float = 0.0
    seed: int = 0


Send = Callable[[], Awaitable[bool]]


# -- clients ------------------------------------------------------------------------------------


def _row(width: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((1, width), dtype=np.float32)


async def build_client(spec: LoadSpec) -> tuple[Send, Callable[[], Awaitable[None]]]:
    """A ``send()`` coroutine for ``spec.protocol`` (True on a well-formed 200/OK answer) and
    a ``close()``. Request bodies are encoded once: the benchmark measures the server."""
    row = _row(spec.width, spec.seed)
    if spec.protocol == "grpc":
        return await _grpc_client(spec, row)
    if spec.protocol == "grpc-stream":
        return await _grpc_stream_client(spec, row)
    return await _http_client(spec, row)


def http_request_bytes(spec: LoadSpec, row: np.ndarray) -> bytes:
    """One whole HTTP/1.1 request (keep-alive), encoded once and sent as is every time."""
    tensor: dict[str, Any] = {"name": "x", "datatype": "FP32", "shape": list(row.shape)}
    if spec.protocol == "http-json":
        tensor["data"] = row.reshape(-1).tolist()
        body = json.dumps({"inputs": [tensor]}).encode()
        extra = "Content-Type: application/json\r\n"
    elif spec.protocol == "http-binary":
        raw = row.tobytes()
        tensor["parameters"] = {"binary_data_size": len(raw)}
        head = json.dumps({"inputs": [tensor], "parameters": {"binary_data_output": True}})
        body = head.encode() + raw
        extra = (
            "Content-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {len(head.encode())}\r\n"
        )
    else:
        raise ValueError(f"unknown protocol {spec.protocol!r}; choose from {PROTOCOLS}")
    start = (
        f"POST /v2/models/{spec.model}/infer HTTP/1.1\r\nHost: {spec.host}:{spec.http_port}\r\n"
        f"{extra}Content-Length: {len(body)}\r\n\r\n"
    )
    return start.encode() + body


class _HttpConnection(asyncio.Protocol):
    """One keep-alive connection that carries one request at a time. A hand-rolled client:
    it parses only the status line and Content-Length, so the load generator costs a few tens
    of microseconds of CPU per request instead of aiohttp's few hundred, which on 2 shared
    cores would otherwise be taken from the server under test."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._waiter: asyncio.Future[int] | None = None
        self.broken: BaseException | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(buf[:end]).lower()
        at = head.find(b"\r\ncontent-length:")
        if at < 0:
            self._finish(None, ValueError("response without Content-Length"))
            return
        line_end = head.find(b"\r\n", at + 2)
        length = int(head[at + 17 : line_end if line_end >= 0 else None])
        if len(buf) < end + 4 + length:
            return
        status = int(buf[9:12])
        del buf[: end + 4 + length]
        self._finish(status, None)

    def _finish(self, status: int | None, exc: BaseException | None) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is None or waiter.done():
            return
        if exc is not None:
            self.broken = exc
            waiter.set_exception(exc)
        else:
            waiter.set_result(status)  # type: ignore[arg-type]

    def connection_lost(self, exc: BaseException | None) -> None:
        self.broken = exc or ConnectionResetError("server closed the connection")
        self._finish(None, self.broken)

    def request(self, payload: bytes) -> asyncio.Future[int]:
        assert self.transport is not None
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(payload)
        return self._waiter


async def _http_client(
    spec: LoadSpec, row: np.ndarray
) -> tuple[Send, Callable[[], Awaitable[None]]]:
    payload = http_request_bytes(spec, row)
    loop = asyncio.get_running_loop()
    idle: list[_HttpConnection] = []
    opened: list[_HttpConnection] = []

    async def send() -> bool:
        conn = idle.pop() if idle else None
        if conn is None:
            _, conn = await loop.create_connection(_HttpConnection, spec.host, spec.http_port)
            opened.append(conn)
        try:
            status = await asyncio.wait_for(conn.request(payload), REQUEST_TIMEOUT_S)
        except BaseException:
            if conn.transport is not None:
                conn.transport.close()  # its answer may still come: never reuse it
            raise
        if conn.broken is None and len(idle) < HTTP_POOL:
            idle.append(conn)
        elif conn.transport is not None:
            conn.transport.close()
        return status == 200

    async def close() -> None:
        for conn in opened:
            if conn.transport is not None:
                conn.transport.close()

    return send, close


async def _grpc_client(
    spec: LoadSpec, row: np.ndarray
) -> tuple[Send, Callable[[], Awaitable[None]]]:
    import grpc

    from inferway.backends.protocol import pb2, pb2_grpc

    request = pb2.ModelInferRequest(model_name=spec.model)
    request.inputs.add(name="x", datatype="FP32", shape=list(row.shape))
    request.raw_input_contents.append(row.tobytes())
    # Separate TCP connections: one HTTP/2 connection would serialize on one socket.
    channels = [
        grpc.aio.insecure_channel(
            f"{spec.host}:{spec.grpc_port}", options=[("grpc.use_local_subchannel_pool", 1)]
        )
        for _ in range(GRPC_CHANNELS)
    ]
    stubs = [pb2_grpc.GRPCInferenceServiceStub(c) for c in channels]
    counter = [0]

    async def send() -> bool:
        counter[0] += 1
        stub = stubs[counter[0] % len(stubs)]
        await stub.ModelInfer(request, timeout=REQUEST_TIMEOUT_S)
        return True

    async def close() -> None:
        await asyncio.gather(*(c.close() for c in channels))

    return send, close


async def _grpc_stream_client(
    spec: LoadSpec, row: np.ndarray
) -> tuple[Send, Callable[[], Awaitable[None]]]:
    """ModelStreamInfer: one long-lived stream per channel; each request is one message with
    its own id, and a reader per stream resolves the sender's future by that id."""
    import grpc

    from inferway.backends.protocol import pb2

    template = pb2.ModelInferRequest(model_name=spec.model)
    template.inputs.add(name="x", datatype="FP32", shape=list(row.shape))
    template.raw_input_contents.append(row.tobytes())
    base = template.SerializeToString()
    waiting: dict[str, asyncio.Future[bool]] = {}
    channels, calls, outboxes, tasks = [], [], [], []

    def with_id(rid: str) -> bytes:
        # Protobuf merges concatenated messages: appending field 3 (id) sets the id.
        raw = rid.encode()
        assert len(raw) < 128  # a one-byte length
        return base + b"\x1a" + bytes([len(raw)]) + raw

    async def read(call: Any) -> None:
        async for answer in call:
            fut = waiting.pop(answer.infer_response.id, None)
            if fut is not None and not fut.done():
                fut.set_result(answer.error_message == "")

    async def write(call: Any, outbox: asyncio.Queue[bytes]) -> None:
        while True:
            await call.write(await outbox.get())

    for _ in range(GRPC_CHANNELS):
        channel = grpc.aio.insecure_channel(
            f"{spec.host}:{spec.grpc_port}", options=[("grpc.use_local_subchannel_pool", 1)]
        )
        method = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=lambda b: b,
            response_deserializer=pb2.ModelStreamInferResponse.FromString,
        )
        call = method()
        outbox: asyncio.Queue[bytes] = asyncio.Queue()
        channels.append(channel)
        calls.append(call)
        outboxes.append(outbox)
        tasks += [asyncio.create_task(read(call)), asyncio.create_task(write(call, outbox))]
    counter = itertools.count()
    loop = asyncio.get_running_loop()

    async def send() -> bool:
        n = next(counter)
        rid = str(n)
        fut = loop.create_future()
        waiting[rid] = fut
        outboxes[n % len(outboxes)].put_nowait(with_id(rid))
        try:
            return await asyncio.wait_for(fut, REQUEST_TIMEOUT_S)
        finally:
            waiting.pop(rid, None)

    async def close() -> None:
        for task in tasks:
            task.cancel()
        for call in calls:
            call.cancel()
        await asyncio.gather(*(c.close() for c in channels))

    return send, close


# -- drivers ------------------------------------------------------------------------------------


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


async def _timed(send: Send, scheduled: float, lat: list[float], errors: list[str]) -> None:
    try:
        ok = await send()
    except Exception as exc:  # every failure is counted, by kind, never raised
        errors.append(type(exc).__name__)
        return
    if ok:
        lat.append(time.perf_counter() - scheduled)
    else:
        errors.append("status")


async def run_open_loop(send: Send, rate: float, duration_s: float, seed: int = 0) -> dict:
    """Poisson arrivals at ``rate``/s for ``duration_s``; latency from the scheduled time."""
    rng = np.random.default_rng(seed)
    n = max(1, int(rate * duration_s * 1.2) + 16)
    offsets = np.cumsum(rng.exponential(1.0 / rate, n))
    offsets = offsets[offsets < duration_s].tolist()
    lat: list[float] = []
    errors: list[str] = []
    lags: list[float] = []
    tasks: set[asyncio.Task[None]] = set()
    cpu0 = _cpu_seconds()
    start = time.perf_counter()
    i = 0
    while i < len(offsets):
        now = time.perf_counter()
        due = start + offsets[i]
        if due > now:
            await asyncio.sleep(due - now)
            now = time.perf_counter()
        # Send everything that is due: timer granularity must not thin the arrivals out.
        while i < len(offsets) and start + offsets[i] <= now:
            scheduled = start + offsets[i]
            lags.append(now - scheduled)
            task = asyncio.create_task(_timed(send, scheduled, lat, errors))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
    if tasks:
        _, pending = await asyncio.wait(list(tasks), timeout=REQUEST_TIMEOUT_S + 2)
        for task in pending:  # no answer at all: a failure, not a missing sample
            task.cancel()
            errors.append("unanswered")
    end = time.perf_counter()
    lags.sort()
    return {
        "sent": len(offsets),
        "latencies_s": lat,
        "errors": errors,
        "elapsed_s": end - start,
        "send_lag_p99_ms": lags[int(0.99 * (len(lags) - 1))] * 1000 if lags else 0.0,
        "client_cpu_s": _cpu_seconds() - cpu0,
    }


async def run_closed_loop(send: Send, concurrency: int, duration_s: float) -> dict:
    """``concurrency`` clients back to back for ``duration_s``."""
    lat: list[float] = []
    errors: list[str] = []
    cpu0 = _cpu_seconds()
    start = time.perf_counter()
    stop_at = start + duration_s

    async def client() -> None:
        while time.perf_counter() < stop_at:
            await _timed(send, time.perf_counter(), lat, errors)

    await asyncio.gather(*(client() for _ in range(concurrency)))
    end = time.perf_counter()
    return {
        "sent": len(lat) + len(errors),
        "latencies_s": lat,
        "errors": errors,
        "elapsed_s": end - start,
        "send_lag_p99_ms": 0.0,
        "client_cpu_s": _cpu_seconds() - cpu0,
    }


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


# -- worker process -----------------------------------------------------------------------------


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
