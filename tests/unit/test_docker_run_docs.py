"""The ``docker run`` commands of docs/kubernetes.md, which tests/image runs as written, hold the
containers as the base manifests run them: the same image, user, read-only root, dropped
capabilities, environment, arguments and volume paths, a tmpfs for each ``emptyDir``, the
container ports they publish, and a stop grace equal to the pods'. Checked here without a
container engine, so a manifest edit that the docs miss fails ``make test``."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from inferway.gateway.admin_documents import ADMIN_TOKEN_ENV
from tests.docker_run_docs import RunCommand, documented_commands, parse_run
from tests.kustomize_build import build

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "kubernetes" / "base"


@pytest.fixture(scope="module")
def pods() -> dict[str, dict[str, Any]]:
    """Each base Deployment's pod spec, by the container's role (``backend``, ``gateway``)."""
    specs = {}
    for resource in build(BASE):
        if resource["kind"] == "Deployment":
            spec = resource["spec"]["template"]["spec"]
            (container,) = spec["containers"]
            specs[container["name"]] = spec
    assert set(specs) == {"backend", "gateway"}
    return specs


@pytest.fixture(scope="module")
def runs() -> dict[str, RunCommand]:
    """The documented ``docker run`` commands by what they run: ``version``, ``backend``,
    ``gateway``."""
    by_role = {}
    for argv in documented_commands():
        if argv[:2] != ["docker", "run"]:
            continue
        run = parse_run(argv)
        role = {"--version": "version", "serve": "backend", "run": "gateway"}[run.args[0]]
        by_role[role] = run
    assert set(by_role) == {"version", "backend", "gateway"}
    return by_role


def _as_the_pod_runs_it(
    run: RunCommand, pod: dict[str, Any], *, left_out: frozenset[str] = frozenset()
) -> None:
    """``left_out``: mount paths the pod needs only for its init container's work."""
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert run.image == container["image"]
    user = pod["securityContext"]
    assert run.value("--user") == f"{user['runAsUser']}:{user['runAsGroup']}"
    assert ("--read-only" in run.flags) == security["readOnlyRootFilesystem"]
    assert run.values("--cap-drop") == security["capabilities"]["drop"]
    assert run.values("--security-opt") == ["no-new-privileges"]
    assert security["allowPrivilegeEscalation"] is False
    assert run.values("--entrypoint") == [] and "command" not in container
    assert run.args == [*container["args"]]
    volumes = {v["name"]: v for v in pod["volumes"]}
    filled = {m["name"] for c in pod.get("initContainers", []) for m in c["volumeMounts"]}
    tmpfs = set(run.values("--tmpfs"))
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if mount["mountPath"] in left_out:
            assert mount["mountPath"] not in run.volumes and mount["mountPath"] not in tmpfs
        elif "emptyDir" in volume and mount["name"] not in filled:
            assert mount["mountPath"] in tmpfs, mount
        else:
            host, read_only = run.volumes[mount["mountPath"]]
            assert host.startswith("$PWD/") and read_only == mount.get("readOnly", False), mount
    assert tmpfs <= {m["mountPath"] for m in container["volumeMounts"]}
    ports = {p["containerPort"] for p in container["ports"]}
    for published in run.values("-p"):
        address, _host_port, container_port = published.split(":")
        assert address == "127.0.0.1", "the docs publish on loopback only"
        assert int(container_port) in ports


def test_the_backend_container_is_the_manifests(
    runs: dict[str, RunCommand], pods: dict[str, dict[str, Any]]
) -> None:
    backend, pod = runs["backend"], pods["backend"]
    # In the pod, the init container links the store (/model-store) into /models and writes
    # each model's config.yaml there; a docker run mounts a ready repository at /models.
    _as_the_pod_runs_it(backend, pod, left_out=frozenset({"/model-store"}))
    (container,) = pod["containers"]
    assert backend.env == {e["name"]: e["value"] for e in container["env"]}
    assert backend.passed_env == []
    assert backend.volumes[backend.env["INFERWAY_MODEL_REPOSITORY"]] == ("$PWD/models", True)
    policy = yaml.safe_load((BASE / "policy.yaml").read_text())
    (service,) = [s for s in policy["services"] if s["name"] == "model"]
    (endpoint,) = service["endpoints"]
    host, port = endpoint.rsplit(":", 1)
    assert backend.values("--network-alias") == [host], "the policy's endpoint, unchanged"
    assert port == backend.env["INFERWAY_HTTP_PORT"]


def test_the_gateway_container_is_the_manifests(
    runs: dict[str, RunCommand], pods: dict[str, dict[str, Any]]
) -> None:
    gateway, pod = runs["gateway"], pods["gateway"]
    _as_the_pod_runs_it(gateway, pod)
    (container,) = pod["containers"]
    # the admin token: from a Secret in the pod, from the calling shell in a docker run (so
    # that it shows on no command line), never a literal value
    secret_env = {e["name"] for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})}
    assert secret_env == {e["name"] for e in container["env"]} == {ADMIN_TOKEN_ENV}
    assert gateway.passed_env == [ADMIN_TOKEN_ENV]
    assert set(gateway.env) == {"INFERWAY_HEALTH_URL"}
    exported = [argv for argv in documented_commands() if argv[:1] == ["export"]]
    assert exported == [["export", f"{ADMIN_TOKEN_ENV}=$(openssl rand -hex 32)"]]
    health = urlsplit(gateway.env["INFERWAY_HEALTH_URL"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    liveness = container["livenessProbe"]["httpGet"]
    assert (health.hostname, health.port, health.path) == (
        "127.0.0.1",
        ports[liveness["port"]],
        liveness["path"],
    )
    published = {int(p.split(":")[2]) for p in gateway.values("-p")}
    assert published == set(ports.values()), "the listener and the admin API"
    assert gateway.value("--network") == runs["backend"].value("--network")


def test_the_version_check_and_the_stops(
    runs: dict[str, RunCommand], pods: dict[str, dict[str, Any]]
) -> None:
    version = runs["version"]
    assert version.image == runs["gateway"].image == runs["backend"].image
    assert version.value("--user") == runs["gateway"].value("--user")
    assert "--read-only" in version.flags and version.values("--tmpfs") == ["/tmp"]
    stops = [argv for argv in documented_commands() if argv[:2] == ["docker", "stop"]]
    names = {runs[role].value("--name") for role in ("backend", "gateway")}
    assert {argv[-1] for argv in stops} == names
    for argv in stops:
        role = "gateway" if argv[-1] == runs["gateway"].value("--name") else "backend"
        assert argv[2:4] == ["--time", str(pods[role]["terminationGracePeriodSeconds"])]
