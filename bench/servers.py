"""The servers the batching benchmark measures, each in its own process.

- the inferway backend (``start_backend`` under uvloop) over a generated model repository;
- the issue's yardstick: the tiny model behind a plain aiohttp handler, ONNX Runtime called
  inline on the event loop, no batching, KServe v2 JSON in and out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import signal
import urllib.request
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from _common import free_port
from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "ServerProcess",
    "WorkersServer",
    "backend_server_main",
    "fast_backend_server_main",
    "plain_server_main",
    "plain_server_threads_main",
    "scrape_batches",
]


def backend_server_main(root: str, conn: Connection) -> None:
    """``start_backend`` over ``root`` under uvloop, aiohttp serving all of HTTP; send the
    ports, stop on recv."""
    _backend_server(root, "aiohttp", conn)


def fast_backend_server_main(root: str, conn: Connection) -> None:
    """``backend_server_main`` with the fast HTTP front end (protocol/fast_http.py)."""
    _backend_server(root, "fast", conn)


def _backend_server(root: str, frontend: str, conn: Connection) -> None:
    import logging

    import uvloop

    logging.basicConfig(level=logging.WARNING)
    from inferway.backends.process_tuning import freeze_startup_heap, tune_for_serving

    tune_for_serving()  # as `inferway serve` does

    async def serve() -> None:
        from inferway.backends.app import start_backend
        from inferway.backends.serving.settings import ServingSettings

        settings = ServingSettings(http_frontend=frontend)
        handle = await start_backend(root, watch=False, settings=settings)
        freeze_startup_heap()  # as `inferway serve` does
        conn.send((handle.http_port, handle.grpc_port))
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        await handle.stop(grace=1.0)

    uvloop.run(serve())


class ServerProcess:
    """A server in a child process (the backend, or the plain reference); ``stop()`` drains
    and joins it. ``metrics``: whether it serves the backend's /metrics."""

    def __init__(
        self, target: Any, args: tuple[Any, ...], *, metrics: bool, timeout_s: float = 180.0
    ) -> None:
        ctx = mp.get_context("spawn")
        self.metrics = metrics
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=target, args=(*args, child), name="server")
        self._proc.start()
        child.close()
        if not self._conn.poll(timeout_s):
            self._proc.kill()
            raise RuntimeError(f"server {target.__name__}{args} did not start in {timeout_s:.0f}s")
        try:
            self.http_port, self.grpc_port = self._conn.recv()
        except EOFError:
            self._proc.join(5)
            raise RuntimeError(
                f"server {target.__name__} exited with code {self._proc.exitcode} before "
                "listening; its traceback is printed above"
            ) from None
        assert self._proc.pid is not None
        self.process = psutil.Process(self._proc.pid)

    def cpu_seconds(self) -> float:
        t = self.process.cpu_times()
        return t.user + t.system

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self._conn.send("stop")
        self._proc.join(20)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)


class WorkersServer:
    """``inferway serve ROOT --workers N`` as a user runs it, on two free ports; ready once it
    prints that every worker is. CPU is counted over the parent and all its workers."""

    metrics = True

    def __init__(
        self, root: Path, workers: int, timeout_s: float = 180.0, frontend: str = "aiohttp"
    ) -> None:
        import subprocess
        import sys
        import time

        self.http_port, self.grpc_port = free_port(), free_port()
        command = [sys.executable, "-m", "inferway.cli.main", "serve", str(root)]
        command += ["--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port)]
        command += ["--workers", str(workers), "--log-level", "warning"]
        command += ["--http-frontend", frontend]
        from inferway.parent_death import set_parent_death_signal

        parent = os.getpid()
        self._proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            # a benchmark killed mid-run must not leave the server running
            preexec_fn=lambda: set_parent_death_signal(signal.SIGTERM, expected_parent=parent),
        )
        assert self._proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        seen = []
        for line in self._proc.stdout:
            seen.append(line)
            if f"all {workers} workers ready" in line:
                break
            if time.monotonic() > deadline:
                break
        else:
            raise RuntimeError("inferway serve --workers exited:\n" + "".join(seen))
        if f"all {workers} workers ready" not in seen[-1]:
            self.stop()
            raise RuntimeError("inferway serve --workers did not get ready:\n" + "".join(seen))
        self.process = psutil.Process(self._proc.pid)
        import threading

        # Keep reading its output, so a chatty server never blocks on a full pipe.
        threading.Thread(target=self._proc.stdout.read, daemon=True).start()

    def cpu_seconds(self) -> float:
        total = 0.0
        for p in [self.process, *self.process.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
        return total

    def stop(self) -> None:
        self._proc.send_signal(signal.SIGTERM)
        try:
            self._proc.wait(30)
        except Exception:
            self._proc.kill()
            self._proc.wait(5)


def scrape_batches(port: int, model: str) -> tuple[float, float, float]:
    """(rows, batches, compute seconds) the server has executed for ``model`` so far, from
    /metrics; the compute seconds are each batch's model run as the server timed it."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    wanted = {
        "inferway_backend_batch_size_sum": 0,
        "inferway_backend_batch_size_count": 1,
        "inferway_backend_compute_seconds_sum": 2,
    }
    sums = [0.0, 0.0, 0.0]
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            slot = wanted.get(sample.name)
            if slot is not None and sample.labels.get("model") == model:
                sums[slot] += sample.value
    return sums[0], sums[1], sums[2]


def plain_server_main(onnx_path: str, model: str, conn: Connection) -> None:
    """Serve ``onnx_path`` as ``model`` on a free loopback port; send the port, stop on recv."""
    plain_server_threads_main(onnx_path, model, 0, conn)


def plain_server_threads_main(onnx_path: str, model: str, intra: int, conn: Connection) -> None:
    """``plain_server_main`` with ONNX Runtime's intra-op threads stated (0: its default)."""
    import asyncio

    import onnxruntime as ort
    import uvloop
    from aiohttp import web

    options = ort.SessionOptions()
    if intra:
        options.intra_op_num_threads = intra
        options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"])
    output = session.get_outputs()[0].name

    async def infer(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        tensor = body["inputs"][0]
        x = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
        y = session.run([output], {tensor["name"]: x})[0]
        answer = {
            "model_name": model,
            "outputs": [
                {
                    "name": output,
                    "datatype": "FP32",
                    "shape": list(y.shape),
                    "data": y.ravel().tolist(),
                }
            ],
        }
        return web.json_response(answer)

    async def serve() -> None:
        app = web.Application()
        app.router.add_post(f"/v2/models/{model}/infer", infer)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        conn.send((port, 0))
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        await runner.cleanup()

    uvloop.run(serve())
