"""Abandoned requests are not computed under load (issue 33, item 6): 256 clients each send one
request to a weights-bound model (2048->4096->4096->10, batches of at most 8) and hang up
50 ms later. The rows computed stay within the rows answered plus one batch per model
instance (the batch that may have started just before its client's hang-up was read), and
every request is counted once: answered (200) or cancelled (499 / CANCELLED).

The clients run in a process of their own (blocking sockets, the synchronous gRPC client), so
their 50 ms are real time and their view of what was answered is not slowed by the backend's
busy event loop (nor its hold on the GIL). Loopback only."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import select
import socket
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from inferway.backends.protocol import pb2, pb2_grpc
from inferway.devtools.demo_models import build_mlp
from tests.backend_helpers import running_backend
from tests.prometheus_text import parse_exposition, sample_value

pytestmark = pytest.mark.integration

CLIENTS = 256
HANG_UP_S = 0.05
SIZES = (2048, 4096, 4096, 10)
MAX_BATCH = 8
CONFIG = {"batching": {"max_batch_size": MAX_BATCH}}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("heavy-repo")
    build_mlp(root / "heavy" / "1" / "model.onnx", SIZES)
    (root / "heavy" / "config.yaml").write_text(json.dumps(CONFIG))
    return root


@pytest.fixture
async def backend(repository: Path):
    async with running_backend(repository) as handle:
        yield handle


def _http_request() -> bytes:
    data = np.linspace(-1, 1, SIZES[0], dtype=np.float32).round(3).tolist()
    body = json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, SIZES[0]], "data": data}]}
    ).encode()
    head = (
        "POST /v2/models/heavy/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


def _http_clients(port: int) -> int:
    """Open CLIENTS connections, send one request on each, close each HANG_UP_S after its
    send; how many had a whole answer by then."""
    request = _http_request()
    socks: list[socket.socket] = []
    sent: dict[socket.socket, float] = {}
    got: dict[socket.socket, bytes] = {}
    for _ in range(CLIENTS):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(request)
        sent[sock] = time.monotonic()
        got[sock] = b""
        socks.append(sock)
    answered = 0
    open_socks = set(socks)
    while open_socks:
        now = time.monotonic()
        for sock in [s for s in open_socks if now - sent[s] >= HANG_UP_S]:
            if got[sock].startswith(b"HTTP/1.1 200") and _whole(got[sock]):
                answered += 1
            sock.close()
            open_socks.discard(sock)
        if not open_socks:
            break
        ready, _, _ = select.select(list(open_socks), [], [], 0.005)
        for sock in ready:
            chunk = sock.recv(65536)
            got[sock] += chunk
    return answered


def _whole(answer: bytes) -> bool:
    head, sep, body = answer.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False


def _grpc_clients(port: int) -> tuple[int, float]:
    """CLIENTS unary calls made at once, all cancelled HANG_UP_S after the first was made
    unless answered by then (one moment: a starved client process must not spread its
    cancels over several batches); how many were answered, and when (time.monotonic, the
    system-wide clock) the last cancel was sent."""
    req = pb2.ModelInferRequest(model_name="heavy")
    req.inputs.add(name="x", datatype="FP32", shape=[1, SIZES[0]])
    req.raw_input_contents.append(np.ones((1, SIZES[0]), np.float32).tobytes())
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb2_grpc.GRPCInferenceServiceStub(channel)
        stub.ServerLive(pb2.ServerLiveRequest())  # connected before the clock starts
        started = time.monotonic()
        calls = [stub.ModelInfer.future(req) for _ in range(CLIENTS)]
        time.sleep(max(0.0, started + HANG_UP_S - time.monotonic()))
        # cancel() is False for a call whose answer came first (read or not yet looked at)
        cancelled = [call.cancel() for call in calls]
        sent = time.monotonic()
        answered = sum(
            1
            for call, gone in zip(calls, cancelled, strict=True)
            if not gone and call.exception() is None
        )
    return answered, sent


async def _in_client_process(clients: Callable[[int], Any], port: int) -> Any:
    context = multiprocessing.get_context("spawn")  # no fork of a process with a running loop
    with ProcessPoolExecutor(1, mp_context=context) as pool:
        return await asyncio.get_running_loop().run_in_executor(pool, clients, port)


async def _metrics(backend) -> list:
    reader, writer = await asyncio.open_connection("127.0.0.1", backend.http_port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    raw = await reader.read()
    writer.close()
    return parse_exposition(raw.partition(b"\r\n\r\n")[2].decode())


async def _settled(
    backend, protocol: str, ok_code: str, cancelled_code: str
) -> tuple[float, float, float]:
    """(rows computed, answered 200, cancelled) once the executor is idle and the counts have
    stopped moving (a gRPC call cancelled before it reached the server is never counted)."""
    executor = backend.repository.get("heavy").executor
    deadline = time.monotonic() + 30
    last: tuple[float, float, float] | None = None
    while True:
        samples = await _metrics(backend)
        ok = sample_value(
            samples, name="inferway_backend_requests_total", protocol=protocol, code=ok_code
        )
        gone = sample_value(
            samples, name="inferway_backend_requests_total", protocol=protocol, code=cancelled_code
        )
        rows = sample_value(samples, name="inferway_backend_batch_size_sum", model="heavy")
        now = (rows, ok, gone)
        idle = executor.queue_depth == 0 and executor.in_flight_batches == 0
        if idle and now == last:
            return now
        last = now if idle else None
        assert time.monotonic() < deadline, f"{ok} answered + {gone} cancelled, still moving"
        await asyncio.sleep(0.5)


async def _check(
    backend,
    answered: int,
    protocol: str,
    ok_code: str,
    gone_code: str,
    slack_batches: int | None = 1,
) -> None:
    """Rows computed <= rows answered + ``slack_batches`` batches per instance (None: no
    bound on rows here). Answered: what the clients read before hanging up, or what the
    server had answered by then (an answer on its way when the client hung up was computed
    for a client still there). Every hang-up the server saw is counted as cancelled."""
    rows, ok, cancelled = await _settled(backend, protocol, ok_code, gone_code)
    assert cancelled > 0, "no hang-up was counted as cancelled"
    assert ok + cancelled >= rows, "a computed request was counted neither answered nor gone"
    if slack_batches is None:
        return
    instances = backend.repository.get("heavy").executor.instances
    assert rows <= max(answered, ok) + slack_batches * MAX_BATCH * instances, (
        f"{rows:.0f} rows computed for {answered} answered of {CLIENTS} (the server answered "
        f"{ok:.0f}, counted {cancelled:.0f} cancelled)"
    )


async def test_http_clients_that_hang_up_under_load_are_not_computed(backend) -> None:
    answered = await _in_client_process(_http_clients, backend.http_port)
    await _check(backend, answered, "http", "200", "499")


async def test_grpc_calls_cancelled_under_load_are_not_computed(backend) -> None:
    """gRPC learns of a cancel from its own threads, a moment after the client sent it, and
    an answer may be on its way when a client cancels: so what is checked is the batches
    that started once every cancel was sent. They hold only abandoned calls; at most one
    batch per instance of them (launched while the cancels were on their way) is computed."""
    executor = backend.repository.get("heavy").executor
    started: list[tuple[float, int]] = []
    report = executor._reporter._on_batch  # the metrics' hook: kept, and watched here

    def watch(record) -> None:
        started.append((record.started_at, record.size_rows))
        report(record)

    executor._reporter._on_batch = watch
    answered, cancels_sent = await _in_client_process(_grpc_clients, backend.grpc_port)
    await _check(backend, answered, "grpc", "OK", "CANCELLED", slack_batches=None)
    late = [rows for at, rows in started if at >= cancels_sent]
    assert sum(late) <= MAX_BATCH * executor.instances, (
        f"batches of {late} rows started after every client had cancelled"
    )
