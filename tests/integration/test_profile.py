"""``inferway profile`` against a real ``inferway serve`` under load: py-spy attaches, writes a
flame graph SVG and the top frames; the admin API's ``POST /profile`` does the same remotely
and refuses without the admin token."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from aiohttp import web
from typer.testing import CliRunner

from inferway.cli.main import app
from inferway.devtools.demo_models import write_demo_repository
from inferway.gateway.admin import start_admin_server
from inferway.gateway.admin_security import ADMIN_TOKEN, admin_security_middleware
from inferway.gateway.profile_admin import add_profile_routes
from inferway.gateway.profile_targets import ProfileTarget, find_targets
from inferway.observability.py_spy import find_py_spy
from tests.envoy_process import free_port
from tests.serve_process import wait_serve_ready

pytestmark = pytest.mark.integration

SIZES = (8, 16, 4)
BODY = {"inputs": [{"name": "x", "shape": [1, 8], "datatype": "FP32", "data": [0.5] * 8}]}


def _ptrace_allowed() -> str | None:
    """None when py-spy may attach to a child of ours, else why not (the skip reason)."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.3)
        done = subprocess.run(
            [find_py_spy(), "dump", "--pid", str(sleeper.pid)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if done.returncode == 0:
            return None
        return f"py-spy cannot attach here (ptrace not permitted?): {done.stderr.strip()[:200]}"
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str]]:
    reason = _ptrace_allowed()
    if reason is not None:
        pytest.skip(reason)
    models = tmp_path_factory.mktemp("profile") / "models"
    write_demo_repository(models, versions=(1,), sizes=SIZES)
    port = free_port()
    command = [sys.executable, "-m", "inferway.cli.main", "serve", "--model-repository"]
    command += [str(models), "--http-port", str(port), "--grpc-port", str(free_port())]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    wait_serve_ready(proc, base)
    stop = threading.Event()

    def load() -> None:  # bounded: it ends with the module
        with httpx.Client(base_url=base, timeout=5) as client:
            while not stop.is_set():
                client.post("/v2/models/demo/infer", json=BODY)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    try:
        yield proc.pid, base
    finally:
        stop.set()
        worker.join(timeout=10)
        proc.terminate()
        proc.wait(timeout=20)


def test_profile_by_pid_writes_a_flame_graph_and_top_frames(
    backend: tuple[int, str], tmp_path: Path
) -> None:
    pid, _ = backend
    svg = tmp_path / "serve.svg"
    args = ["profile", "--pid", str(pid), "--seconds", "2", "--out", str(svg), "-o", "json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["pid"] == pid and document["samples"] > 0
    assert document["top"] and all(row["self_samples"] >= 0 for row in document["top"])
    assert svg.read_text().lstrip().startswith("<?xml") and "<svg" in svg.read_text()
    # the table form: a header line and the columns (another run: its frames may differ)
    text = CliRunner().invoke(app, [*args[:-2], "--top", "5"])
    assert text.exit_code == 0, text.output
    assert f"pid {pid}: " in text.stdout and "samples over 2 s" in text.stdout
    assert "self %" in text.stdout and "total %" in text.stdout


def test_target_backend_finds_the_serve_process(backend: tuple[int, str]) -> None:
    pid, _ = backend
    assert pid in [c.pid for c in find_targets(ProfileTarget.backend)]


def test_a_process_that_is_not_there_is_a_clear_error(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    args = ["profile", "--pid", str(gone.pid), "--seconds", "1", "--out", str(tmp_path / "x.svg")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert f"no process {gone.pid}" in result.stderr


def test_admin_profile_needs_the_token_and_profiles_a_replica(
    backend: tuple[int, str], tmp_path: Path
) -> None:
    pid, _ = backend
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")

    async def scenario() -> None:
        admin_app = web.Application(middlewares=[admin_security_middleware])
        admin_app[ADMIN_TOKEN] = "s3cret"
        add_profile_routes(admin_app, lambda service: {"demo": [pid]}[service])
        server = await start_admin_server(admin_app, port=0)
        try:
            async with httpx.AsyncClient(timeout=30) as client:
                refused = await client.post(f"{server.url}/profile", json={})
                assert refused.status_code == 401
                unknown = await client.post(
                    f"{server.url}/profile",
                    json={"target": "backend", "service": "nope"},
                    headers={"Authorization": "Bearer s3cret"},
                )
                assert unknown.status_code == 404 and "nope" in unknown.json()["error"]
            svg = tmp_path / "remote.svg"
            args = ["profile", "--admin", server.url, "--token-file", str(token_file)]
            args += ["--target", "backend", "--service", "demo", "--seconds", "2"]
            args += ["--out", str(svg), "-o", "json"]
            result = await asyncio.to_thread(CliRunner().invoke, app, args)
            assert result.exit_code == 0, result.output
            document = json.loads(result.stdout)
            assert document["pid"] == pid and document["samples"] > 0
            assert document["target"] == "backend demo[0]"
            assert "<svg" in svg.read_text()
        finally:
            await server.stop()

    asyncio.run(scenario())


def test_admin_profiles_the_control_plane_itself(tmp_path: Path) -> None:
    """target gateway: the admin API's own process (here the test's), idle threads included
    so an idle control plane still has samples."""
    reason = _ptrace_allowed()
    if reason is not None:
        pytest.skip(reason)

    async def scenario() -> None:
        admin_app = web.Application(middlewares=[admin_security_middleware])
        admin_app[ADMIN_TOKEN] = "t"
        add_profile_routes(admin_app)
        server = await start_admin_server(admin_app, port=0)
        try:
            async with httpx.AsyncClient(timeout=30) as client:
                answer = await client.post(
                    f"{server.url}/profile",
                    json={"target": "gateway", "seconds": 1, "idle": True},
                    headers={"Authorization": "Bearer t"},
                )
                no_replicas = await client.post(
                    f"{server.url}/profile",
                    json={"target": "backend", "service": "x"},
                    headers={"Authorization": "Bearer t"},
                )
        finally:
            await server.stop()
        assert answer.status_code == 200, answer.text
        document = answer.json()
        assert document["target"] == "gateway" and document["samples"] > 0
        assert "<svg" in document["svg"]
        assert no_replicas.status_code == 404 and "runs no replicas" in no_replicas.text

    asyncio.run(scenario())
