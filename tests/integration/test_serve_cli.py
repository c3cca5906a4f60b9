"""``inferway serve`` as a user runs it: a real subprocess over a model repository, answering
the Open Inference Protocol until SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from inferway.cli.main import app
from inferway.devtools.demo_models import mlp_reference, write_demo_repository
from tests.envoy_process import free_port
from tests.serve_process import wait_serve_ready

pytestmark = pytest.mark.integration

SIZES = (8, 16, 4)


def _mlp_body(x: np.ndarray) -> dict:
    return {
        "inputs": [
            {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}
        ]
    }


def test_serve_with_the_model_repository_option_answers_inference_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    write_demo_repository(tmp_path / "models", versions=(1,), sizes=SIZES)
    http_port, grpc_port = free_port(), free_port()
    command = [sys.executable, "-m", "inferway.cli.main", "serve"]
    command += ["--model-repository", str(tmp_path / "models")]
    command += ["--http-port", str(http_port), "--grpc-port", str(grpc_port)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        base = f"http://127.0.0.1:{http_port}"
        wait_serve_ready(proc, base)
        x = np.linspace(-1, 1, SIZES[0], dtype=np.float32).reshape(1, -1)
        answer = httpx.post(f"{base}/v2/models/demo/infer", json=_mlp_body(x), timeout=5)
        assert answer.status_code == 200, answer.text
        (output,) = answer.json()["outputs"]
        expected = mlp_reference(x, sizes=SIZES, seed=0)
        np.testing.assert_allclose(
            np.array(output["data"]).reshape(expected.shape), expected, rtol=1e-4, atol=1e-5
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out
    assert f"http://127.0.0.1:{http_port}" in out


def test_serve_takes_the_body_limit_and_listen_backlog_from_its_options(tmp_path: Path) -> None:
    write_demo_repository(tmp_path / "models", versions=(1,), sizes=SIZES)
    http_port, grpc_port = free_port(), free_port()
    command = [sys.executable, "-m", "inferway.cli.main", "serve", str(tmp_path / "models")]
    command += ["--http-port", str(http_port), "--grpc-port", str(grpc_port)]
    command += ["--max-body-bytes", "300", "--backlog", "77", "--default-timeout", "5"]
    command += ["--record-outputs", "10"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        base = f"http://127.0.0.1:{http_port}"
        wait_serve_ready(proc, base)
        listening = subprocess.run(
            ["ss", "-ltnH", f"sport = :{http_port}"], capture_output=True, text=True, check=True
        ).stdout
        assert int(listening.split()[2]) == 77  # ss shows a listener's backlog as Send-Q
        big = np.ones((16, SIZES[0]), np.float32)  # about 700 bytes of JSON
        answer = httpx.post(f"{base}/v2/models/demo/infer", json=_mlp_body(big), timeout=5)
        assert answer.status_code == 413
        assert "exceeds the limit of 300 bytes for model 'demo'" in answer.json()["error"]
        small = _mlp_body(np.ones((1, SIZES[0]), np.float32))
        headers = {"x-request-id": "r-1"}
        ok = httpx.post(f"{base}/v2/models/demo/infer", json=small, headers=headers, timeout=5)
        assert ok.status_code == 200, ok.text
        recorded = httpx.get(f"{base}/v2/debug/outputs", timeout=5).json()["records"]
        assert [r["request_id"] for r in recorded] == ["r-1"]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out


def test_serve_refuses_two_different_repositories_and_a_missing_one(tmp_path: Path) -> None:
    runner = CliRunner(env={"COLUMNS": "400"})  # keep rich from wrapping the message
    both = runner.invoke(app, ["serve", str(tmp_path / "a"), "--model-repository", str(tmp_path)])
    assert both.exit_code == 2 and "two different repositories" in both.output
    missing = runner.invoke(app, ["serve", "--model-repository", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "is not a directory" in missing.output
    recording = ["serve", str(tmp_path), "--record-outputs", "10", "--workers", "2"]
    recording += ["--http-port", "1", "--grpc-port", "2"]
    split = runner.invoke(app, recording)
    assert split.exit_code == 2 and "record outputs with --workers 1" in split.output
