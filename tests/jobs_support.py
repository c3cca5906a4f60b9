"""What the job tests share: a model repository with a fast model and a slow one, a real
``inferway serve`` process, a real ``redis-server`` (Debian's package), a callback receiver on
loopback, and polling a job until it reaches a state (always with a deadline)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from aiohttp import web

from inferway.devtools.demo_models import build_add, write_demo_repository
from tests.aiohttp_sites import start_site
from tests.components import require_binary
from tests.envoy_process import free_port

__all__ = [
    "SIZES",
    "SLOW_WINDOW_S",
    "CallbackReceiver",
    "RedisServer",
    "ServeProcess",
    "metric",
    "slow_body",
    "submit",
    "wait_for_job",
    "write_job_repository",
]

SIZES = (8, 16, 4)
SLOW_WINDOW_S = 10.0
"""The slow model's batching window: a one-row request waits this long for a second row before
it is computed, so its job stays running long enough to be cancelled or to outlive its backend
(with seconds to spare on a loaded machine); two rows (or two one-row jobs at once) fill the
batch and are computed at once."""


def write_job_repository(root: Path) -> Path:
    """``demo`` (the MLP, SIZES) and ``slow`` (a + b in batches of 2 rows; a lone row waits
    SLOW_WINDOW_S)."""
    models = root / "models"
    write_demo_repository(models, versions=(1,), sizes=SIZES)
    build_add(models / "slow" / "1" / "model.onnx")
    batching = {"mode": "fixed", "max_batch_size": 2, "max_queue_delay_s": SLOW_WINDOW_S}
    (models / "slow" / "config.yaml").write_text(json.dumps({"batching": batching}))
    return models


def slow_body(value: float, rows: int = 1) -> dict[str, Any]:
    """``slow``'s request: one row waits out the window, two are computed at once."""
    data = [value] * 4 * rows
    return {
        "inputs": [
            {"name": n, "shape": [rows, 4], "datatype": "FP32", "data": data} for n in ("a", "b")
        ]
    }


class ServeProcess:
    """``inferway serve MODELS --http-port P ... EXTRA`` as a subprocess, its output in a file."""

    def __init__(self, models: Path, log: Path, extra: Iterable[str] = ()) -> None:
        self.http_port, self.grpc_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        self._log_path = log
        command = [sys.executable, "-m", "inferway.cli.main", "serve", str(models)]
        command += ["--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port)]
        command += ["--log-format", "text", *extra]
        with log.open("ab") as out:
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self._log_path.read_text(errors="replace")[-4000:]

    def wait_ready(self, timeout: float = 60.0) -> ServeProcess:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, f"inferway serve exited:\n{self.log()}"
            try:
                if httpx.get(f"{self.url}/v2/health/ready", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"inferway serve never ready:\n{self.log()}"
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL: no draining, no cleanup, as a crash or an OOM kill."""
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


class RedisServer:
    """A throwaway redis-server on a free loopback port: no persistence, always killed."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}"
        binary = require_binary("redis-server", "the jobs' Redis Streams store")
        command = [binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        command += ["--save", "", "--appendonly", "no", "--dir", str(workdir)]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        import redis

        client = redis.Redis(port=self.port, socket_connect_timeout=1)
        while True:
            assert self.proc.poll() is None, "redis-server exited"
            try:
                if client.ping():
                    break
            except redis.ConnectionError:
                pass
            assert time.monotonic() < deadline, "redis-server never answered PING"
            time.sleep(0.05)
        client.close()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


class CallbackReceiver:
    """An aiohttp server on loopback recording each POSTed job document; it answers the
    statuses in ``statuses`` in turn (then 200), to exercise retries."""

    def __init__(self, statuses: Iterable[int] = ()) -> None:
        self.statuses = list(statuses)
        self.received: list[dict[str, Any]] = []
        self.answered: list[int] = []
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def _hook(self, request: web.Request) -> web.Response:
        self.received.append(await request.json())
        status = self.statuses.pop(0) if self.statuses else 200
        self.answered.append(status)
        return web.Response(status=status)

    async def __aenter__(self) -> CallbackReceiver:
        app = web.Application()
        app.router.add_post("/hook", self._hook)
        self._runner, port = await start_site(app)
        self.url = f"http://127.0.0.1:{port}/hook"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


async def submit(
    session: aiohttp.ClientSession,
    model: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any], aiohttp.typedefs.LooseHeaders]:
    """POST .../infer preferring async: (status, JSON body, headers)."""
    async with session.post(
        f"/v2/models/{model}/infer",
        json=body,
        headers={"Prefer": "respond-async", **(headers or {})},
    ) as resp:
        return resp.status, await resp.json(), resp.headers


async def wait_for_job(
    session: aiohttp.ClientSession,
    job_id: str,
    states: Iterable[str],
    timeout: float = 30.0,
    *,
    until: Any = None,
) -> dict[str, Any]:
    """Poll GET /v2/jobs/{id} until its status is one of ``states`` (and ``until(doc)``)."""
    wanted = set(states)
    deadline = time.monotonic() + timeout
    doc: dict[str, Any] = {}
    while True:
        try:
            async with session.get(f"/v2/jobs/{job_id}") as resp:
                if resp.status == 200:
                    doc = await resp.json()
                    if doc["status"] in wanted and (until is None or until(doc)):
                        return doc
        except aiohttp.ClientConnectionError:
            pass  # a backend restarting
        assert time.monotonic() < deadline, f"job {job_id} never {sorted(wanted)}: {doc}"
        await asyncio.sleep(0.05)


async def metric(session: aiohttp.ClientSession, name: str, **labels: str) -> float:
    """One sample of the backend's /metrics (0 when absent)."""
    from tests.prometheus_text import parse_exposition, sample_value

    async with session.get("/metrics") as resp:
        text = await resp.text()
    return float(sample_value(parse_exposition(text), name=name, **labels) or 0.0)
