"""The CPU overlay's pods, run on loopback the way the kubelet would run them: volumes as
folders, the backend's init container and main container with their own commands and
environment, then the gateway's container with its own arguments and the policy from the
rendered ConfigMap. The probes' URLs answer, a request goes through the gateway's Envoy to the
backend found by DNS name (STRICT_DNS, as with the headless Service), and the image's
HEALTHCHECK command passes against the backend and fails once it stopped. Only what a host
cannot give is changed: bind addresses and ports (loopback, free ports), mount points (folders
under tmp_path) and the backend's DNS name (``localhost``).
"""

from __future__ import annotations

import os
import signal
import socket
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

from inferway.backends.models.config import load_model_config
from tests.envoy_process import free_port
from tests.kustomize_build import build

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
CPU_OVERLAY = ROOT / "deploy" / "kubernetes" / "overlays" / "cpu"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
ADMIN_SECRET = "inferway-admin-token"
"""The Secret docs/kubernetes.md has the operator create (key ``token``)."""
ADMIN_TOKEN = "a-test-admin-token"


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

    def __init__(
        self,
        spec: dict[str, Any],
        config_maps: dict[str, dict[str, str]],
        root: Path,
        secrets: dict[str, dict[str, str]] | None = None,
    ):
        self.spec = spec
        self.root = root
        self.secrets = secrets or {}
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

    def remap_argument(self, c: dict[str, Any], argument: str) -> str:
        """A path, or the value of ``--name=path``, mapped onto the volume folders."""
        if argument.startswith("--") and "=" in argument:
            name, value = argument.split("=", 1)
            return f"{name}={self.remap(c, value)}"
        return self.remap(c, argument)

    def command(self, c: dict[str, Any]) -> list[str]:
        """``command`` + ``args`` (the image's ENTRYPOINT is ``inferway``), paths mapped."""
        argv = [*c.get("command", ["inferway"]), *c.get("args", [])]
        argv = [self.remap_argument(c, a) for a in argv]
        if argv[0] == "inferway":
            return [sys.executable, "-m", "inferway.cli.main", *argv[1:]]
        assert argv[0] == "python", argv
        return [sys.executable, *argv[1:]]

    def value_of(self, c: dict[str, Any], variable: dict[str, Any]) -> str:
        """A variable's value: literal (paths mapped) or a Secret's key, as the kubelet gives
        it; a Secret the test did not create fails as the pod would not start."""
        if "value" in variable:
            return self.remap(c, variable["value"])
        reference = variable["valueFrom"]["secretKeyRef"]
        secret = self.secrets.get(reference["name"], {})
        assert reference["key"] in secret, f"{variable['name']}: no Secret {reference}"
        return secret[reference["key"]]

    def environment(self, c: dict[str, Any], overrides: dict[str, str]) -> dict[str, str]:
        env = {e["name"]: self.value_of(c, e) for e in c.get("env", [])}
        assert set(overrides) <= set(env), "only variables the manifest sets are overridden"
        return {**os.environ, "PYTHONPATH": str(ROOT), **env, **overrides}


def healthcheck_argv() -> list[str]:
    """The Dockerfile's HEALTHCHECK CMD (exec form), with this interpreter for ``python``."""
    (check,) = [i for i in dockerfile.parse_file(str(DOCKERFILE)) if i.cmd == "HEALTHCHECK"]
    assert check.json and check.value[0] == "CMD" and check.value[1] == "python", check
    return [sys.executable, *check.value[2:]]


def with_options(args: list[str], options: dict[str, str]) -> list[str]:
    """``args`` with each ``--name=value`` in ``options`` replaced, or appended if absent."""
    kept = [a for a in args if a.split("=", 1)[0] not in options]
    return kept + [f"{name}={value}" for name, value in options.items()]


def start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    """A container's process, leading its own process group, its output in ``log``."""
    with log.open("w") as out:
        return subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )


def wait_until_ok(
    url: str, process: subprocess.Popen[str], log: Path, method: str = "GET", **kwargs: Any
) -> None:
    """Poll ``url`` until it answers 200 (60 s deadline), failing at once if ``process`` died."""
    deadline = time.monotonic() + 60
    last: object = None
    while True:
        assert process.poll() is None, f"{log.name}: exited\n{log.read_text()}"
        try:
            answer = httpx.request(method, url, timeout=2, **kwargs)
            if answer.status_code == 200:
                return
            last = f"{answer.status_code} {answer.text[:200]}"
        except httpx.TransportError as error:
            last = error
        assert time.monotonic() < deadline, f"{url}: no 200; last {last}\n{log.read_text()}"
        time.sleep(0.1)


def stop(process: subprocess.Popen[str]) -> None:
    """SIGTERM to the process group it leads (its workers or its Envoy), as the kubelet does."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
    process.wait(timeout=30)


INFER = {
    "inputs": [
        {"name": "a", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]},
        {"name": "b", "shape": [1, 2], "datatype": "FP32", "data": [10, 20]},
    ]
}


def test_the_cpu_overlay_pods_serve_a_request_from_gateway_to_backend(tmp_path: Path) -> None:
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
    backend_log = tmp_path / "backend.log"
    server = start(pod.command(backend), env, backend_log)
    try:
        wait_until_ok(base + backend["readinessProbe"]["httpGet"]["path"], server, backend_log)
        for probe in ("startupProbe", "livenessProbe"):
            live = httpx.get(base + backend[probe]["httpGet"]["path"], timeout=2)
            assert live.status_code == 200, probe
        answer = httpx.post(f"{base}/v2/models/add/infer", json=INFER, timeout=10)
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["data"] == [11, 22]
        checked = subprocess.run(healthcheck_argv(), env=health, timeout=30, check=False)
        assert checked.returncode == 0, "HEALTHCHECK fails against a ready backend"
        run_gateway(resources, config_maps, tmp_path / "gateway", http_port)
    finally:
        stop(server)
    checked = subprocess.run(
        healthcheck_argv(), env=health, capture_output=True, timeout=30, check=False
    )
    assert checked.returncode != 0, "HEALTHCHECK passes with no backend"


def run_gateway(
    resources: list[dict[str, Any]],
    config_maps: dict[str, dict[str, str]],
    root: Path,
    backend_port: int,
) -> None:
    """The gateway pod in front of the running backend: a request through its Envoy."""
    (deployment,) = [
        r
        for r in resources
        if r["kind"] == "Deployment" and r["metadata"]["name"] == "inferway-gateway"
    ]
    listener_port, admin_port = free_port(), free_port()
    # Edited as text: a YAML round trip would turn the `on:` of retries into `true:`.
    policy = config_maps["inferway-policy"]["policy.yaml"]
    for old, new in (
        ("address: 0.0.0.0", "address: 127.0.0.1"),
        ("port: 10000", f"port: {listener_port}"),
        # a DNS name still, resolved by Envoy (STRICT_DNS) as the Service's name would be
        ("inferway-backend.inferway.svc.cluster.local:8000", f"localhost:{backend_port}"),
    ):
        assert policy.count(old) == 1, old
        policy = policy.replace(old, new)
    root.mkdir()
    pod = Pod(
        deployment["spec"]["template"]["spec"],
        {**config_maps, "inferway-policy": {"policy.yaml": policy}},
        root,
        secrets={ADMIN_SECRET: {"token": ADMIN_TOKEN}},
    )
    (gateway,) = deployment["spec"]["template"]["spec"]["containers"]
    gateway = {
        **gateway,
        "args": with_options(
            gateway["args"],
            {
                "--admin-address": "127.0.0.1",
                "--admin-port": str(admin_port),
                "--xds-port": str(free_port()),
                "--envoy-admin-port": str(free_port()),
            },
        ),
    }
    log = root / "gateway.log"
    process = start(pod.command(gateway), pod.environment(gateway, {}), log)
    try:
        liveness = gateway["livenessProbe"]["httpGet"]["path"]
        wait_until_ok(f"http://127.0.0.1:{admin_port}{liveness}", process, log)
        assert gateway["readinessProbe"]["tcpSocket"]["port"] == "inference"
        url = f"http://127.0.0.1:{listener_port}/v2/models/add/infer"
        wait_until_ok(url, process, log, method="POST", json=INFER)
        with socket.create_connection(("127.0.0.1", listener_port), timeout=2):
            pass  # what the readiness probe does
        answer = httpx.post(url, json=INFER, timeout=10)
        assert answer.json()["outputs"][0]["data"] == [11, 22]
        admin = f"http://127.0.0.1:{admin_port}"
        bearer = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        metrics = httpx.get(f"{admin}/envoy/stats/prometheus", headers=bearer, timeout=5)
        assert metrics.status_code == 200 and "envoy_cluster_upstream_rq_total" in metrics.text
        # the admin token is the Secret's (what the ServiceMonitor sends), not a generated one
        assert httpx.post(f"{admin}/reload", headers=bearer, timeout=10).status_code == 200
        wrong = {"Authorization": "Bearer not-the-secret"}
        assert httpx.post(f"{admin}/reload", headers=wrong, timeout=10).status_code == 401
    finally:
        stop(process)
