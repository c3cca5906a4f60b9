"""deploy/Dockerfile built and run for real: the CPU image, built on Debian's Docker engine from a
base made of Debian's packages (conftest.py), runs the commands docs/kubernetes.md gives (read
by tests/docker_run_docs.py, which tests/unit/test_docker_run_docs.py holds to the manifests),
with this test's own names, folders and free host ports. A backend and a gateway container on
one network turn healthy through the image's HEALTHCHECK, serve a request from the host, apply
a weight edit of the mounted policy in Envoy, and ``docker stop`` of the gateway fails none of
the requests four keep-alive clients keep sending.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dockerfile
import httpx
import pytest

from inferway.devtools.demo_models import build_add
from inferway.gateway.admin_documents import ADMIN_TOKEN_ENV
from tests.docker_run_docs import documented_commands, parse_run
from tests.envoy_process import free_port
from tests.image.conftest import BuiltImage
from tests.image.engine import LABEL, ROOT, Engine
from tests.keep_alive_client import KeepAliveClient, wait_until_flowing
from tests.prometheus_text import parse_exposition, sample_value

pytestmark = [pytest.mark.image, pytest.mark.timeout(1500)]

DOCUMENTED_IMAGE = "inferway:0.1.0"
CANARY_ALIAS = "inferway-backend-canary.inferway.svc.cluster.local"
INFER = json.dumps(
    {
        "inputs": [
            {"name": "a", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]},
            {"name": "b", "shape": [1, 2], "datatype": "FP32", "data": [10, 20]},
        ]
    }
)
_HEALTHY_TIMEOUT_S = 120.0
ADMIN_TOKEN = uuid.uuid4().hex
"""The value of the documented ``export INFERWAY_ADMIN_TOKEN=...`` for this test's gateway."""
BEARER = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@dataclass
class Deployment:
    """The documented commands made this test's own: names, folders and host ports."""

    engine: Engine
    image: str
    folder: Path
    suffix: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    host_ports: dict[int, int] = field(default_factory=dict)

    def name(self, documented: str) -> str:
        return f"{documented}-test-{self.suffix}"

    def localize(self, argv: list[str]) -> list[str]:
        """``argv`` without its leading ``docker``, for this test's engine."""
        names = {n: self.name(n) for n in ("inferway", "inferway-backend", "inferway-gateway")}
        out: list[str] = []
        for word in argv[1:]:
            if word == DOCUMENTED_IMAGE:
                word = self.image
            elif word in names:
                word = names[word]
            elif word.startswith("$PWD/"):
                word = str(self.folder) + word.removeprefix("$PWD")
            elif word.startswith("127.0.0.1:") and word.count(":") == 2:
                _, _, container_port = word.split(":")
                port = self.host_ports.setdefault(int(container_port), free_port())
                word = f"127.0.0.1:{port}:{container_port}"
            out.append(word)
        if out[:1] == ["run"] or out[:2] == ["network", "create"]:
            at = 1 if out[0] == "run" else 2
            out[at:at] = ["--label", LABEL]
        return out

    def state(self, documented: str) -> dict[str, Any]:
        inspected = self.engine.run("inspect", "--format", "{{json .State}}", self.name(documented))
        state: dict[str, Any] = json.loads(inspected.stdout)
        return state

    def logs(self, documented: str) -> str:
        done = self.engine.run("logs", self.name(documented), check=False)
        return (done.stdout + done.stderr)[-6000:]

    def wait_healthy(self, documented: str) -> float:
        """Seconds until the image's HEALTHCHECK reports healthy; fails if the container exits."""
        began = time.monotonic()
        while True:
            state = self.state(documented)
            assert state["Running"], f"{documented} exited: {state}\n{self.logs(documented)}"
            if state.get("Health", {}).get("Status") == "healthy":
                return time.monotonic() - began
            assert time.monotonic() - began < _HEALTHY_TIMEOUT_S, (
                f"{documented}: not healthy after {_HEALTHY_TIMEOUT_S:.0f}s: "
                f"{state.get('Health')}\n{self.logs(documented)}"
            )
            time.sleep(1)


@pytest.fixture
def deployment(engine: Engine, image: BuiltImage, tmp_path: Path) -> Iterator[Deployment]:
    """The folders the documented commands mount: ``models/`` with a two-input Add model and
    ``policy/`` with the base manifests' policy, readable by the image's user (uid 10001)."""
    build_add(tmp_path / "models" / "add" / "1" / "model.onnx", features=2)
    (tmp_path / "policy").mkdir()
    shutil.copy(ROOT / "deploy" / "kubernetes" / "base" / "policy.yaml", tmp_path / "policy")
    for path in [tmp_path / "models", tmp_path / "policy", *tmp_path.glob("*/**/*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    placed = Deployment(engine, image.tag, tmp_path)
    try:
        yield placed
    finally:
        for role in ("inferway-gateway", "inferway-backend"):
            engine.run("rm", "-f", placed.name(role), check=False)
        engine.run("network", "rm", placed.name("inferway"), check=False)


def _commands() -> dict[str, list[str]]:
    """The documented commands by what they do."""
    commands: dict[str, list[str]] = {}
    for argv in documented_commands():
        if argv[:1] == ["export"]:
            continue  # the admin token: this test passes its own to the gateway's docker run
        if argv[:2] == ["docker", "run"]:
            first = parse_run(argv).args[0]
            key = {"--version": "version", "serve": "backend", "run": "gateway"}[first]
        else:
            key = " ".join(argv[1:2] + argv[-1:])  # "network inferway", "stop inferway-gateway"
        commands[key] = argv
    return commands


def test_the_image_reports_its_build_and_runs_as_the_manifests_user(
    engine: Engine, image: BuiltImage, deployment: Deployment, capsys: pytest.CaptureFixture[str]
) -> None:
    with capsys.disabled():
        print(
            f"\nimage {image.tag}: base {image.base} ready in {image.base_s:.0f}s, CPU image "
            f"built in {image.build_s:.0f}s, {image.size_bytes / 1e6:.0f} MB"
        )
    config = json.loads(engine.run("image", "inspect", image.tag).stdout)[0]["Config"]
    assert config["User"] == "10001:10001" and config["Entrypoint"] == ["inferway"]
    (check,) = [
        i
        for i in dockerfile.parse_file(str(ROOT / "deploy" / "Dockerfile"))
        if i.cmd == "HEALTHCHECK"
    ]
    assert config["Healthcheck"]["Test"] == list(check.value)
    version = engine.run(*deployment.localize(_commands()["version"]), timeout=60)
    project = (ROOT / "pyproject.toml").read_text()
    assert version.stdout.strip() == "inferway " + project.split('version = "', 1)[1].split('"')[0]


_READER_PROBE = """
import json, os, subprocess, sys, tempfile
from inferway.gateway.envoy_modules import provide_envoy_modules
from inferway.xds.envoy_binary import find_envoy
from inferway.xds.sse_module_build import SEARCH_PATH_ENV, c_compiler
bootstrap = {}
env = provide_envoy_modules(bootstrap)
with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
    f.write(sys.argv[1])
check = subprocess.run([find_envoy(), "--mode", "validate", "-c", f.name],
                       env={**os.environ, **env}, capture_output=True, text=True)
print(json.dumps({"compiler": c_compiler(), "folder": env.get(SEARCH_PATH_ENV),
                  "metadata": bootstrap.get("node", {}).get("metadata", {}),
                  "validated": check.returncode == 0, "said": check.stderr[-600:]}))
"""
_VALIDATE_WITH_READER = """
static_resources:
  listeners:
  - name: probe
    address: {socket_address: {address: 127.0.0.1, port_value: 10000}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.\
http_connection_manager.v3.HttpConnectionManager
          stat_prefix: probe
          route_config: {name: probe, virtual_hosts: [{name: probe, domains: ["*"]}]}
          http_filters:
          - name: inferway.llm_sse
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.\
DynamicModuleFilter
              dynamic_module_config: {name: inferway_sse}
              filter_name: inferway.llm_sse
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"""
"""A listener with the native reader, as the translator writes it: Envoy's validation mode
loads the module (it fails naming the module when the search path lacks it)."""


def test_the_image_gives_envoy_the_native_sse_reader_without_a_compiler(
    engine: Engine, image: BuiltImage
) -> None:
    """Built in the image's build stage; the runtime stage has no compiler and uses that build
    (docs/llm.md): its Envoy reads LLM streams with the native reader, not the Lua filter."""
    run = ["run", "--rm", "--label", LABEL, "--entrypoint", "python", image.tag, "-c"]
    out = engine.run(*run, _READER_PROBE, _VALIDATE_WITH_READER, timeout=120).stdout
    found = json.loads(out.strip().splitlines()[-1])
    assert found["compiler"] is None
    assert found["folder"].startswith("/opt/inferway/envoy-modules/"), found
    assert found["metadata"] == {"INFERWAY_ENVOY_MODULES": "inferway_sse"}, found
    assert found["validated"], found["said"]  # the image's Envoy loaded the module


def test_backend_and_gateway_serve_apply_a_weight_edit_and_drain_on_stop(
    engine: Engine, deployment: Deployment, capsys: pytest.CaptureFixture[str]
) -> None:
    commands = _commands()
    engine.run(*deployment.localize(commands["network inferway"]))
    # the canary service of the weight edit: the same backend under a second name
    backend = deployment.localize(commands["backend"])
    backend[1:1] = ["--network-alias", CANARY_ALIAS]
    engine.run(*backend)
    # `-e INFERWAY_ADMIN_TOKEN`: the documented `export` in the shell that runs docker
    engine.run(*deployment.localize(commands["gateway"]), env={ADMIN_TOKEN_ENV: ADMIN_TOKEN})
    backend_s = deployment.wait_healthy("inferway-backend")
    gateway_s = deployment.wait_healthy("inferway-gateway")
    listener = f"http://127.0.0.1:{deployment.host_ports[10000]}"
    admin = f"http://127.0.0.1:{deployment.host_ports[15000]}"
    # the admin API binds 0.0.0.0 in the container: Envoy's stats need the token, as the
    # ServiceMonitor sends it; /metrics stays open
    refused = httpx.get(f"{admin}/envoy/stats/prometheus", timeout=5)
    assert refused.status_code == 401, f"{refused.status_code} {refused.text}"
    assert httpx.get(f"{admin}/metrics", timeout=5).status_code == 200

    answer = _first_ok(f"{listener}/v2/models/add/infer", deployment)
    assert answer.json()["outputs"][0]["data"] == [11, 22]

    policy = deployment.folder / "policy" / "policy.yaml"
    _save(policy, _with_canary(policy.read_text(), model=100, canary=0))
    _until_cluster(admin, "model-canary")
    assert _where_requests_go(admin, listener, 20) == {"model": 20, "model-canary": 0}
    _save(policy, _with_canary(policy.read_text(), model=0, canary=100, edit=True))
    _until_requests_reach(admin, "model-canary", listener)
    assert _where_requests_go(admin, listener, 20) == {"model": 0, "model-canary": 20}

    clients = [
        KeepAliveClient(
            deployment.host_ports[10000],
            "/v2/models/add/infer",
            method="POST",
            body=INFER,
            headers={"content-type": "application/json"},
        )
        for _ in range(4)
    ]
    for client in clients:
        client.start()
    wait_until_flowing(clients, at_least=3, timeout=30)
    began = time.monotonic()
    engine.run(*deployment.localize(commands["stop inferway-gateway"]), timeout=60)
    stop_s = time.monotonic() - began
    for client in clients:
        client.join(timeout=60)
    failures = [f for c in clients for f in c.failures]
    logs = deployment.logs("inferway-gateway")
    assert failures == [], f"{failures[:5]}\n{logs}"
    assert all(c.told_to_go for c in clients), "every client got Connection: close"
    assert deployment.state("inferway-gateway")["ExitCode"] == 0, logs
    assert "draining envoy's listeners" in logs, logs
    assert stop_s < 15, f"docker stop took {stop_s:.1f}s\n{logs}"
    engine.run(*deployment.localize(commands["stop inferway-backend"]), timeout=60)
    assert deployment.state("inferway-backend")["ExitCode"] == 0, deployment.logs(
        "inferway-backend"
    )
    with capsys.disabled():
        print(
            f"\nhealthy after {backend_s:.0f}s (backend), {gateway_s:.0f}s (gateway); docker "
            f"stop of the gateway {stop_s:.1f}s, {sum(c.ok for c in clients)} requests, none failed"
        )


def _first_ok(url: str, deployment: Deployment) -> httpx.Response:
    """The first 200 for an inference request (Envoy resolves the backend's name and health
    checks it first); 60 s at most."""
    deadline = time.monotonic() + 60
    while True:
        try:
            answer = httpx.post(url, content=INFER, timeout=5)
            if answer.status_code == 200:
                return answer
            last: object = f"{answer.status_code} {answer.text[:200]}"
        except httpx.TransportError as error:
            last = error
        assert time.monotonic() < deadline, f"{url}: {last}\n{deployment.logs('inferway-gateway')}"
        time.sleep(0.5)


def _with_canary(text: str, *, model: int, canary: int, edit: bool = False) -> str:
    """The policy with a second service (the same backend under :data:`CANARY_ALIAS`) sharing
    the route by weight; ``edit``: only the weights change. Edited as text: a YAML round trip
    would turn the `on:` of retries into `true:`."""
    if edit:
        old = [line for line in text.splitlines() if "weight:" in line and "service:" in line]
        assert len(old) == 2, text
        new = [
            f"      - {{service: model, weight: {model}}}",
            f"      - {{service: model-canary, weight: {canary}}}",
        ]
        for before, after in zip(old, new, strict=True):
            text = text.replace(before, after)
        return text
    service = f"services:\n  - name: model-canary\n    endpoints:\n      - {CANARY_ALIAS}:8000\n"
    route = (
        f"      - {{service: model, weight: {model}}}\n"
        f"      - {{service: model-canary, weight: {canary}}}\n"
    )
    assert text.count("services:\n") == 1 and text.count("      - service: model\n") == 1
    return text.replace("services:\n", service).replace("      - service: model\n", route)


def _save(path: Path, text: str) -> None:
    """As an editor (and the kubelet) saves: a new file renamed over the old one."""
    temporary = path.with_name(path.name + ".new")
    temporary.write_text(text)
    temporary.chmod(0o644)
    temporary.replace(path)


def _requests_by_cluster(admin: str) -> dict[str, float]:
    page = httpx.get(f"{admin}/envoy/stats/prometheus", headers=BEARER, timeout=5)
    assert page.status_code == 200, f"/envoy/stats/prometheus: {page.status_code} {page.text}"
    samples = parse_exposition(page.text)
    return {
        cluster: sample_value(
            samples, "envoy_cluster_upstream_rq_total", envoy_cluster_name=cluster
        )
        for cluster in ("model", "model-canary")
    }


def _where_requests_go(admin: str, listener: str, count: int) -> dict[str, int]:
    """How ``count`` requests through the gateway spread over the two services' clusters."""
    before = _requests_by_cluster(admin)
    for _ in range(count):
        answer = httpx.post(f"{listener}/v2/models/add/infer", content=INFER, timeout=5)
        assert answer.status_code == 200, answer.text
    after = _requests_by_cluster(admin)
    return {cluster: int(after[cluster] - before[cluster]) for cluster in before}


def _until_cluster(admin: str, cluster: str) -> None:
    """Until Envoy has the edit's new cluster (its stats exist); 60 s at most."""
    deadline = time.monotonic() + 60
    while True:
        page = httpx.get(f"{admin}/envoy/stats/prometheus", headers=BEARER, timeout=5)
        assert page.status_code == 200, f"/envoy/stats/prometheus: {page.status_code} {page.text}"
        if f'envoy_cluster_name="{cluster}"' in page.text:
            return
        assert time.monotonic() < deadline, f"no cluster {cluster} in Envoy after the edit"
        time.sleep(0.5)


def _until_requests_reach(admin: str, cluster: str, listener: str) -> None:
    """Until a request through the gateway reaches ``cluster``: the weight edit is live."""
    deadline = time.monotonic() + 60
    while _where_requests_go(admin, listener, 1)[cluster] == 0:
        assert time.monotonic() < deadline, f"no request reached {cluster} after the edit"
        time.sleep(0.5)
