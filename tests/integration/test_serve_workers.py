"""``inferway serve --workers 2``: two real worker processes on the same ports. Both answer,
/metrics adds up every worker's counts, a worker that dies is restarted, SIGTERM stops all."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import httpx
import numpy as np
import psutil
import pytest
from typer.testing import CliRunner

from inferway.backends.app import start_backend
from inferway.backends.protocol import pb2, pb2_grpc
from inferway.cli.main import app
from inferway.devtools.demo_models import write_demo_repository
from tests.envoy_process import free_port

pytestmark = pytest.mark.integration

SIZES = (8, 16, 4)
BODY = {
    "inputs": [{"name": "x", "shape": [1, 8], "datatype": "FP32", "data": [0.5] * 8}],
}


class _Lines:
    """The server's output, line by line, read on a thread so a test can wait for a line."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, args=(proc,), daemon=True).start()

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self._queue.put(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                seen = "\n".join(self.seen)
                raise AssertionError(f"no line matching {pattern!r}; saw:\n{seen}") from None
            self.seen.append(line)
            if match := re.search(pattern, line):
                return match


def _workers(pid: int) -> list[psutil.Process]:
    """The worker processes (not multiprocessing's resource tracker)."""
    return [
        c
        for c in psutil.Process(pid).children()
        if not any("resource_tracker" in part for part in c.cmdline())
    ]


def _requests_total(text: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("inferway_backend_requests_total{")
    )


def test_two_workers_share_the_ports_add_up_metrics_and_survive_a_crash(tmp_path: Path) -> None:
    write_demo_repository(tmp_path / "models", versions=(1,), sizes=SIZES)
    http_port, grpc_port = free_port(), free_port()
    command = [sys.executable, "-m", "inferway.cli.main", "serve", str(tmp_path / "models")]
    command += ["--http-port", str(http_port), "--grpc-port", str(grpc_port), "--workers", "2"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = _Lines(proc)
    base = f"http://127.0.0.1:{http_port}"
    try:
        lines.wait_for(r"all 2 workers ready")
        workers = _workers(proc.pid)
        assert len(workers) == 2
        before = [sum(w.cpu_times()[:2]) for w in workers]
        # New connections each time, so the kernel spreads them over both workers.
        for _ in range(40):
            with httpx.Client(base_url=base, timeout=10) as client:
                assert client.post("/v2/models/demo/infer", json=BODY).status_code == 200
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = pb2_grpc.GRPCInferenceServiceStub(channel)
            req = pb2.ModelInferRequest(model_name="demo")
            req.inputs.add(name="x", datatype="FP32", shape=[1, 8])
            req.raw_input_contents.append(np.ones((1, 8), np.float32).tobytes())
            assert stub.ModelInfer(req, timeout=10).outputs
        busy = [sum(w.cpu_times()[:2]) - b for w, b in zip(workers, before, strict=True)]
        assert min(busy) > 0.01, busy  # both did real work (an idle one uses ~1 ms)
        # Whichever worker answers the scrape, it reports every worker's answers.
        for _ in range(4):
            with httpx.Client(base_url=base, timeout=10) as client:
                text = client.get("/metrics").text
            assert _requests_total(text) == 41, text
            assert "inferway_backend_ready 1.0" in text
        # Loading or unloading on request would reach one worker only: refused, said why.
        with httpx.Client(base_url=base, timeout=10) as client:
            unload = client.post("/v2/repository/models/demo/unload")
        assert unload.status_code == 400
        assert "not supported with --workers" in unload.json()["error"]

        # A worker that dies is replaced; the other keeps serving meanwhile.
        victim = workers[0].pid
        os.kill(victim, signal.SIGKILL)
        with httpx.Client(base_url=base, timeout=10) as client:
            assert client.post("/v2/models/demo/infer", json=BODY).status_code == 200
        lines.wait_for(rf"worker \d \(pid (?!{victim}\b)\d+\) ready")
        assert len(_workers(proc.pid)) == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.returncode == 0, "\n".join(lines.seen)
    assert not any(psutil.pid_exists(w.pid) and w.status() != "zombie" for w in workers[1:])


def test_workers_need_fixed_ports(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    args = ["serve", str(tmp_path / "models"), "--workers", "2", "--http-port", "0"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0
    text = result.output.replace("\n", " ")
    assert "workers share their ports" in " ".join(text.split())


async def test_a_single_server_refuses_a_grpc_port_already_in_use(tmp_path: Path) -> None:
    """gRPC would share a busy port by default (SO_REUSEPORT); only workers may."""
    write_demo_repository(tmp_path, "m", sizes=SIZES)
    first = await start_backend(tmp_path, watch=False)
    try:
        with pytest.raises(OSError, match="could not bind"):
            await start_backend(tmp_path, watch=False, grpc_port=first.grpc_port)
    finally:
        await first.stop()
