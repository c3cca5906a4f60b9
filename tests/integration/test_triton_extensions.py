"""Triton's model repository, model configuration and statistics extensions, as Triton's own
client library (tritonclient) calls them against a real ``inferway serve``, over HTTP and gRPC.

tritonclient 2.73 needs protobuf < 7; inferway's environment has protobuf 7, so the client
runs in a virtual environment of its own (made once, kept under the user's cache directory)
and reports what it saw as JSON (tests/integration/tritonclient_script.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import venv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferway.backends.protocol import pb2
from inferway.devtools.demo_models import write_demo_repository
from tests.envoy_process import free_port

pytestmark = pytest.mark.integration

TRITONCLIENT = "tritonclient[http,grpc]>=2.73"
SCRIPT = Path(__file__).with_name("tritonclient_script.py")
FEATURES = 8
REQUESTS = 5
MAX_BATCH = 8


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "inferway-tests" / "tritonclient-venv"


@pytest.fixture(scope="session")
def tritonclient_python() -> Path:
    """A Python with tritonclient installed (its own venv, built once and cached)."""
    root = _cache_dir()
    python = root / "bin" / "python"
    marker = root / ".installed"
    installed = marker.read_text() if marker.exists() else ""
    if installed != TRITONCLIENT:
        shutil.rmtree(root, ignore_errors=True)  # a half-made venv from an interrupted run
        venv.EnvBuilder(with_pip=True).create(root)
        pip = subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                TRITONCLIENT,
            ],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if pip.returncode != 0:
            pytest.fail(f"cannot install {TRITONCLIENT}: {pip.stderr.strip()[-800:]}")
        marker.write_text(TRITONCLIENT)
    return python


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """``inferway serve`` over a batching demo model and a broken one: (HTTP, gRPC) ports."""
    models = tmp_path / "models"
    batching = {"mode": "fixed", "max_batch_size": MAX_BATCH, "max_queue_delay_s": 0.001}
    write_demo_repository(
        models,
        versions=(1,),
        sizes=(FEATURES, 16, 4),
        config={"batching": {**batching, "preferred_batch_sizes": [4]}},
    )
    (models / "broken" / "1").mkdir(parents=True)
    (models / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx model")
    http_port, grpc_port = free_port(), free_port()
    command = [sys.executable, "-m", "inferway.cli.main", "serve", str(models)]
    command += ["--http-port", str(http_port), "--grpc-port", str(grpc_port)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:  # the broken model keeps the server unready: wait for the good one
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                url = f"http://127.0.0.1:{http_port}/v2/models/demo/ready"
                if httpx.get(url, timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "inferway serve never served the demo model"
            time.sleep(0.1)
        yield http_port, grpc_port
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out


def _run_client(python: Path, protocol: str, port: int) -> dict[str, Any]:
    args = [protocol, f"127.0.0.1:{port}", "demo", str(FEATURES), str(REQUESTS)]
    done = subprocess.run(
        [str(python), str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _ints(value: Any) -> Any:
    """gRPC's JSON writes 64-bit integers as strings; HTTP's as numbers. Compare as numbers."""
    if isinstance(value, dict):
        return {k: _ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_ints(v) for v in value]
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return value


def _index(answer: Any) -> dict[str, dict[str, Any]]:
    entries = answer if isinstance(answer, list) else answer.get("models", [])
    return {e["name"]: e for e in entries}


def _spec(field: Any) -> list[Any]:
    """A field as the client script describes one: number, type, repeated, message type."""
    return [
        field.number,
        field.type,
        field.is_repeated,
        field.message_type.name if field.message_type else "",
    ]


def _check_layout(layout: dict[str, Any]) -> None:
    """inferway's messages use tritonclient's field names, numbers, types and labels; the
    request and statistics messages have all of its fields, ModelConfig a subset."""
    partial = {"ModelConfig", "ModelInput", "ModelOutput", "ModelDynamicBatching"}
    partial |= {"ModelInstanceGroup"}
    for name, theirs in layout.items():
        if name in ("DataType", "rpcs"):
            continue
        message = pb2.DESCRIPTOR.message_types_by_name[name]
        ours = {f.name: _spec(f) for f in message.fields}
        for nested in message.nested_types:
            ours.update({f"{nested.name}.{f.name}": _spec(f) for f in nested.fields})
        for field, spec in ours.items():
            assert theirs.get(field) == spec, f"{name}.{field}: ours {spec}, Triton's {theirs}"
        if name not in partial:
            assert set(ours) == set(theirs), f"{name}: ours {sorted(ours)}, {sorted(theirs)}"
    enum = pb2.DESCRIPTOR.enum_types_by_name["DataType"]
    assert {v.name: v.number for v in enum.values} == layout["DataType"]
    service = pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for method in service.methods:
        assert layout["rpcs"][method.name] == [method.input_type.name, method.output_type.name]


def _check_session(seen: dict[str, Any], requests_so_far: int) -> None:
    assert {"model_repository", "model_configuration", "statistics"} <= set(seen["extensions"])

    index = _index(seen["index"])
    assert index["demo"] == {"name": "demo", "version": "1", "state": "READY"}
    assert index["broken"]["state"] == "UNAVAILABLE"
    assert "model.onnx" in index["broken"]["reason"], index["broken"]

    config = _ints(seen["config"].get("config", seen["config"]))
    assert config["name"] == "demo"
    assert config["platform"] == "onnxruntime_onnx"
    assert config["backend"] == "onnxruntime"
    assert config["max_batch_size"] == MAX_BATCH
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("x", "TYPE_FP32", [FEATURES])
    ]
    assert [t["dims"] for t in config["output"]] == [[4]]
    assert config["dynamic_batching"]["preferred_batch_size"] == [4]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 1000

    (raw,) = seen["stats"]["model_stats"]
    assert (raw["name"], raw["version"]) == ("demo", "1")
    stats = _ints(raw)
    infer = stats["inference_stats"]
    assert infer["success"]["count"] == requests_so_far
    assert infer["success"]["ns"] > 0
    assert infer["queue"]["count"] == requests_so_far
    assert infer["compute_infer"]["count"] == requests_so_far
    assert infer["compute_infer"]["ns"] > 0
    assert infer.get("fail", {}).get("count", 0) == 0
    assert stats["inference_count"] == requests_so_far  # one row per request
    assert 1 <= stats["execution_count"] <= requests_so_far
    assert (
        sum(b["compute_infer"]["count"] for b in stats["batch_stats"]) == stats["execution_count"]
    )
    assert stats["last_inference"] > 1e12  # milliseconds since the epoch
    assert [s["name"] for s in _ints(seen["all_stats"])["model_stats"]] == ["demo"]

    assert seen["ready_after_unload"] is False
    unloaded = _index(seen["index_after_unload"])["demo"]
    assert (unloaded["state"], unloaded["reason"]) == ("UNAVAILABLE", "unloaded")
    assert "demo" in seen["config_after_unload"]
    assert seen["ready_after_load"] is True
    assert "no-such-model" in seen["load_unknown"]
    assert "no-such-model" in seen["config_unknown"]
    assert "not supported" in seen["load_with_config"]


def test_tritonclient_repository_config_and_statistics_calls_over_http_and_grpc(
    tritonclient_python: Path, served: tuple[int, int]
) -> None:
    http_port, grpc_port = served
    over_http = _run_client(tritonclient_python, "http", http_port)
    _check_layout(over_http["layout"])
    _check_session(over_http, REQUESTS)
    # Statistics count since the server started, through the unload and load in between.
    _check_session(_run_client(tritonclient_python, "grpc", grpc_port), 2 * REQUESTS)


def test_http_repository_index_ready_filter_and_bad_bodies(served: tuple[int, int]) -> None:
    base = f"http://127.0.0.1:{served[0]}"
    ready = httpx.post(f"{base}/v2/repository/index", json={"ready": True}, timeout=5)
    assert ready.status_code == 200, ready.text
    assert ready.json() == [{"name": "demo", "version": "1", "state": "READY"}]
    bad = httpx.post(f"{base}/v2/repository/index", content=b"[1", timeout=5)
    assert bad.status_code == 400
    assert "/v2/repository/index: body is not JSON" in bad.json()["error"]
    other = httpx.post(f"{base}/v2/repository/elsewhere/index", timeout=5)
    assert other.status_code == 400
    assert "unknown repository 'elsewhere'" in other.json()["error"]
    missing = httpx.get(f"{base}/v2/models/demo/versions/7/stats", timeout=5)
    assert missing.status_code == 404
    assert "no version 7" in missing.json()["error"]
