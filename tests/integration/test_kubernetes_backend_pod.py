"""The CPU overlay's backend pod, run on loopback the way the kubelet would run it: its volumes
as folders, its init container's command and environment (from the rendered ConfigMap), then
its main container's arguments and environment; the probes' URLs answer, a request is served,
and the image's HEALTHCHECK command passes against it and fails once it stopped. Only what a
host cannot give is changed: bind address and ports (loopback, free ports) and the mount
points (folders under tmp_path)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import dockerfile
import httpx
import onnx
import pytest
from onnx import TensorProto, helper

from inferway.backends.model_config import load_model_config
from tests.envoy_process import free_port
from tests.kustomize_build import build

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
CPU_OVERLAY = ROOT / "deploy" / "kubernetes" / "overlays" / "cpu"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"


def write_add_model(path: Path) -> None:
    """A two-input Add model (opset 17), enough to serve one request through the pod."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["sum"])],
        "add",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 2]) for n in ("a", "b")],
        [helper.make_tensor_value_info("sum", TensorProto.FLOAT, ["batch", 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True)
    path.write_bytes(model.SerializeToString())


class Pod:
    """The pod's volumes as folders under ``root``; containers' paths mapped onto them."""

    def __init__(self, spec: dict[str, Any], config_maps: dict[str, dict[str, str]], root: Path):
        self.spec = spec
        self.root = root
        for volume in spec["volumes"]:
            folder = root / volume["name"]
            folder.mkdir()
            if "configMap" in volume:
                for key, text in config_maps[volume["configMap"]["name"]].items():
                    (folder / key).write_text(text)

    def remap(self, c: dict[str, Any], value: str) -> str:
        for mount in c.get("volumeMounts", []):
            mount_path = mount["mountPath"]
            if value == mount_path or value.startswith(mount_path + "/"):
                return str(self.root / mount["name"]) + value[len(mount_path) :]
        return value

    def command(self, c: dict[str, Any]) -> list[str]:
        """``command`` + ``args`` (the image's ENTRYPOINT is ``inferway``), paths mapped."""
        argv = [*c.get("command", ["inferway"]), *c.get("args", [])]
        argv = [self.remap(c, a) for a in argv]
        if argv[0] == "inferway":
            return [sys.executable, "-m", "inferway.gateway.cli", *argv[1:]]
        assert argv[0] == "python", argv
        return [sys.executable, *argv[1:]]

    def environment(self, c: dict[str, Any], overrides: dict[str, str]) -> dict[str, str]:
        env = {e["name"]: self.remap(c, e["value"]) for e in c.get("env", [])}
        assert set(overrides) <= set(env), "only variables the manifest sets are overridden"
        return {**os.environ, "PYTHONPATH": str(ROOT), **env, **overrides}


def healthcheck_argv() -> list[str]:
    """The Dockerfile's HEALTHCHECK CMD (exec form), with this interpreter for ``python``."""
    (check,) = [i for i in dockerfile.parse_file(str(DOCKERFILE)) if i.cmd == "HEALTHCHECK"]
    assert check.json and check.value[0] == "CMD" and check.value[1] == "python", check
    return [sys.executable, *check.value[2:]]


def test_the_cpu_backend_pod_serves_with_its_manifest_settings(tmp_path: Path) -> None:
    resources = build(CPU_OVERLAY)
    (deployment,) = [
        r
        for r in resources
        if r["kind"] == "Deployment" and r["metadata"]["name"] == "inferway-backend"
    ]
    config_maps = {r["metadata"]["name"]: r["data"] for r in resources if r["kind"] == "ConfigMap"}
    spec = deployment["spec"]["template"]["spec"]
    pod = Pod(spec, config_maps, tmp_path)
    write_add_model(tmp_path / "model-store" / "add" / "1" / "model.onnx")

    (init,) = spec["initContainers"]
    done = subprocess.run(
        pod.command(init),
        env=pod.environment(init, {}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    init_env = {e["name"]: e["value"] for e in init["env"]}
    config = load_model_config(tmp_path / "models" / "add" / "config.yaml")
    assert config.provider == init_env["INFERWAY_PROVIDER"] == "cpu"
    assert config.batching.mode == init_env["INFERWAY_BATCHING_MODE"]
    assert config.batching.max_batch_size == int(init_env["INFERWAY_MAX_BATCH_SIZE"])
    assert config.batching.latency_slo_s == float(init_env["INFERWAY_LATENCY_SLO_S"])
    assert (tmp_path / "models" / "add" / "1").resolve() == tmp_path / "model-store" / "add" / "1"

    (backend,) = spec["containers"]
    http_port, grpc_port = free_port(), free_port()
    env = pod.environment(
        backend,
        {
            "INFERWAY_HOST": "127.0.0.1",
            "INFERWAY_HTTP_PORT": str(http_port),
            "INFERWAY_GRPC_PORT": str(grpc_port),
        },
    )
    assert env["INFERWAY_WORKERS"] == "2"  # the overlay's setting, kept
    base = f"http://127.0.0.1:{http_port}"
    health = {**env, "INFERWAY_HEALTH_URL": base + backend["readinessProbe"]["httpGet"]["path"]}
    server = subprocess.Popen(
        pod.command(backend),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, server.communicate()[1]
            try:
                ready = httpx.get(base + backend["readinessProbe"]["httpGet"]["path"], timeout=2)
                if ready.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the readiness probe never passed"
            time.sleep(0.1)
        for probe in ("startupProbe", "livenessProbe"):
            live = httpx.get(base + backend[probe]["httpGet"]["path"], timeout=2)
            assert live.status_code == 200, probe
        answer = httpx.post(
            f"{base}/v2/models/add/infer",
            json={
                "inputs": [
                    {"name": "a", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]},
                    {"name": "b", "shape": [1, 2], "datatype": "FP32", "data": [10, 20]},
                ]
            },
            timeout=10,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["data"] == [11, 22]
        checked = subprocess.run(healthcheck_argv(), env=health, timeout=30, check=False)
        assert checked.returncode == 0, "HEALTHCHECK fails against a ready backend"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    checked = subprocess.run(
        healthcheck_argv(), env=health, capture_output=True, timeout=30, check=False
    )
    assert checked.returncode != 0, "HEALTHCHECK passes with no backend"
