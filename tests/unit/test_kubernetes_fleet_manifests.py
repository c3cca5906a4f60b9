"""deploy/kubernetes/fleet, checked without a cluster as the overlays are
(tests/unit/test_kubernetes_manifests.py): it renders (here in Python, and the same as
``kubectl kustomize`` where that exists), every object is valid against the Kubernetes 1.37
schemas, the objects agree with each other and with the CLI, the gateway pods' termination
fits their grace period, and the Role grants exactly the verbs the ``kubernetes://`` store
sends: a store exercising every method of the Store protocol against the in-memory API server
(tests/kubernetes_api.py) records each request's RBAC verb and resource."""

from __future__ import annotations

import asyncio
import inspect
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from inferway.gateway.envoy_drain import DRAIN_LIMIT_S
from inferway.gateway.fleet.kubernetes_store import KubernetesStore
from inferway.gateway.fleet.store import Store
from inferway.gateway.fleet.store_url import parse_kubernetes_url
from inferway.gateway.supervisor import EnvoySupervisor
from tests.kubernetes_api import FakeApiServer
from tests.kustomize_build import build
from tests.unit.test_kubernetes_manifests import (
    KUBERNETES,
    KUBERNETES_VERSION,
    SERVICE_MONITOR_SCHEMA,
    _by_identity,
    _port_number,
    _selects,
    container,
    find,
    parse_cli,
)

FLEET = KUBERNETES / "fleet"
NAMESPACE = "inferway"

Resource = dict[str, Any]


@pytest.fixture(scope="module")
def resources() -> list[Resource]:
    return build(FLEET)


def env_sources(c: dict[str, Any]) -> dict[str, str]:
    """Each downward-API variable's field path."""
    return {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
        for e in c.get("env", [])
        if "fieldRef" in e.get("valueFrom", {})
    }


@pytest.mark.needs_binary("kubectl", "comparing with kubectl kustomize")
def test_the_python_render_matches_kubectl_kustomize() -> None:
    done = subprocess.run(
        ["kubectl", "kustomize", str(FLEET)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    theirs = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert _by_identity(build(FLEET)) == _by_identity(theirs)


def test_every_rendered_object_is_valid_and_the_one_node_gateway_is_gone(
    resources: list[Resource],
) -> None:
    kinds = Counter(r["kind"] for r in resources)
    assert kinds == {"Namespace": 1, "ServiceAccount": 1, "Role": 1, "RoleBinding": 1,
                     "ConfigMap": 2, "Deployment": 3, "Service": 3, "PodDisruptionBudget": 3,
                     "ServiceMonitor": 2}  # fmt: skip
    for resource in resources:
        if resource["kind"] == "ServiceMonitor":
            jsonschema.validate(resource, SERVICE_MONITOR_SCHEMA)
        else:
            kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)
        if resource["kind"] != "Namespace":
            assert resource["metadata"]["namespace"] == NAMESPACE, resource["metadata"]
    monitors = {r["metadata"]["name"] for r in resources if r["kind"] == "ServiceMonitor"}
    assert monitors == {"inferway-backend", "inferway-control-plane"}
    gateway = find(resources, "Deployment", "inferway-gateway")
    assert [c["name"] for c in gateway["spec"]["template"]["spec"]["containers"]] == ["envoy"]


def test_the_control_plane_runs_three_replicas_behind_a_service_and_a_budget(
    resources: list[Resource],
) -> None:
    deployment = find(resources, "Deployment", "inferway-control-plane")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["replicas"] == 3
    budget = find(resources, "PodDisruptionBudget", "inferway-control-plane")
    assert _selects(budget["spec"]["selector"]["matchLabels"], pod_labels)
    assert budget["spec"]["maxUnavailable"] == 1  # two of three keep serving and electing
    service = find(resources, "Service", "inferway-control-plane")
    assert _selects(service["spec"]["selector"], pod_labels)
    main = container(deployment, "control-plane")
    assert {p["targetPort"] for p in service["spec"]["ports"]} == {p["name"] for p in main["ports"]}
    monitor = find(resources, "ServiceMonitor", "inferway-control-plane")
    assert _selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    for name in ("inferway-gateway", "inferway-backend"):
        other = find(resources, "Deployment", name)
        assert not _selects(
            service["spec"]["selector"], other["spec"]["template"]["metadata"]["labels"]
        )


def test_the_control_plane_arguments_parse_and_name_the_store_its_role_is_for(
    resources: list[Resource],
) -> None:
    deployment = find(resources, "Deployment", "inferway-control-plane")
    pod = deployment["spec"]["template"]["spec"]
    main = container(deployment, "control-plane")
    options = parse_cli(main["args"])
    assert options["no_envoy"] and options["host"] == "0.0.0.0"
    namespace, _ = parse_kubernetes_url(options["store"])
    role = find(resources, "Role", "inferway-fleet-store")
    binding = find(resources, "RoleBinding", "inferway-fleet-store")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == namespace
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "inferway-fleet-store"}  # fmt: skip
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": NAMESPACE}
    ]
    find(resources, "ServiceAccount", pod["serviceAccountName"])
    env = env_sources(main)
    assert options["replica_id"] == "$(POD_NAME)" and env["POD_NAME"] == "metadata.name"
    # the admin URL a replica advertises must reach it from the others: its pod IP
    assert options["admin_address"] == "$(POD_IP)" and env["POD_IP"] == "status.podIP"
    assert _port_number(main, "xds") == options["xds_port"]
    assert _port_number(main, "admin") == options["admin_port"]
    assert _port_number(main, main["livenessProbe"]["httpGet"]["port"]) == options["admin_port"]
    # every replica the one token (commands are forwarded with the caller's), the Secret the
    # one-node gateway reads it from
    assert options["admin_token_file"] is None
    (token,) = [e for e in main["env"] if e["name"] == "INFERWAY_ADMIN_TOKEN"]
    base = build(KUBERNETES / "overlays" / "cpu")
    (one_node,) = container(find(base, "Deployment", "inferway-gateway"), "gateway")["env"]
    assert token == one_node
    mounts = {m["mountPath"]: m["name"] for m in main["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    policy = volumes[mounts[str(Path(options["file"]).parent)]]
    find(resources, "ConfigMap", policy["configMap"]["name"])
    assert volumes[mounts[str(options["workdir"])]] == {"name": "workdir", "emptyDir": {}}


def test_the_gateway_pods_run_envoy_alone_against_the_control_plane_service(
    resources: list[Resource],
) -> None:
    gateway = find(resources, "Deployment", "inferway-gateway")
    pod = gateway["spec"]["template"]["spec"]
    envoy = container(gateway, "envoy")
    options = parse_cli(envoy["args"])
    host, port = options["control_plane"].rsplit(":", 1)
    name, namespace, *domain = host.split(".")
    assert domain == ["svc", "cluster", "local"]
    service = find(resources, "Service", name)
    assert service["metadata"]["namespace"] == namespace
    xds = next(p for p in service["spec"]["ports"] if p["name"] == "xds")
    assert int(port) == xds["port"]
    env = env_sources(envoy)
    assert options["node_id"] == "$(POD_NAME)" and env["POD_NAME"] == "metadata.name"
    assert options["zone"] == "$(ZONE)"
    assert env["ZONE"] == "metadata.labels['topology.kubernetes.io/zone']"
    assert env["REGION"] == "metadata.labels['topology.kubernetes.io/region']"
    assert pod["automountServiceAccountToken"] is False  # Envoy needs no API access
    policy = yaml.safe_load(find(resources, "ConfigMap", "inferway-policy")["data"]["policy.yaml"])
    listener_ports = {listener["port"] for listener in policy["listeners"]}
    assert _port_number(envoy, envoy["readinessProbe"]["tcpSocket"]["port"]) in listener_ports
    public = find(resources, "Service", "inferway-gateway")
    assert [p["targetPort"] for p in public["spec"]["ports"]] == ["inference"]
    assert _selects(public["spec"]["selector"], gateway["spec"]["template"]["metadata"]["labels"])
    budget = find(resources, "PodDisruptionBudget", "inferway-gateway")
    assert gateway["spec"]["replicas"] > budget["spec"]["maxUnavailable"]


def test_a_gateway_pod_drains_within_its_grace_period(resources: list[Resource]) -> None:
    """Deleted: out of the endpoints, preStop's wait, then SIGTERM: the keeper's drain (at
    most DRAIN_LIMIT_S) and Envoy's stop (its grace) must end before the kubelet's SIGKILL;
    the readiness probe notices the closed listener within a few seconds."""
    pod = find(resources, "Deployment", "inferway-gateway")["spec"]["template"]["spec"]
    envoy = container(find(resources, "Deployment", "inferway-gateway"), "envoy")
    pre_stop = envoy["lifecycle"]["preStop"]["sleep"]["seconds"]
    stop_grace = inspect.signature(EnvoySupervisor).parameters["stop_grace"].default
    needed = pre_stop + DRAIN_LIMIT_S + stop_grace
    assert pre_stop >= 2 and needed + 5 <= pod["terminationGracePeriodSeconds"], needed
    probe = envoy["readinessProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] <= DRAIN_LIMIT_S
    assert "livenessProbe" not in envoy


# -- RBAC: exactly the verbs the store sends ------------------------------------------------


class Recording:
    """The store, with the Store protocol's methods it was asked for noted."""

    def __init__(self, store: KubernetesStore) -> None:
        self.store, self.called = store, set[str]()

    def __getattr__(self, name: str) -> Any:
        self.called.add(name)
        return getattr(self.store, name)


async def exercise_every_store_method(server: FakeApiServer) -> set[str]:
    handles = []
    for _ in range(2):
        core, coordination, _ = server.client()
        handles.append(KubernetesStore(core, coordination, NAMESPACE, "rbac", watch_s=1))
    a, b = Recording(handles[0]), Recording(handles[1])
    try:
        first = await a.put("rollouts/model", b"1", expect=0)
        await a.put("rollouts/model", b"2", expect=first.version)
        await a.put("replicas/a", b"{}")
        await a.put("replicas/a", b"{}")
        assert await a.get("rollouts/model") is not None
        assert len(await a.list("rollouts/")) == 1

        async def follow(after: int) -> None:
            async for _record in b.watch("rollouts/", after=after):
                return

        server.compact()
        await asyncio.wait_for(follow(first.version), 5)  # 410, then a list, then a watch
        leadership = await a.campaign("loops", "replica-a", 2.0)
        await asyncio.sleep(1.0)  # a renewal
        await a.put("rollouts/model", b"3", fence=leadership.fence)
        assert await b.leader("loops") == "replica-a"
        await a.resign(leadership)
        assert (await a.health()).ok
    finally:
        await a.close()
        await b.close()
    return a.called | b.called


async def test_the_role_grants_exactly_the_verbs_the_store_sends(
    resources: list[Resource],
) -> None:
    server = FakeApiServer()
    try:
        called = await exercise_every_store_method(server)
    finally:
        server.shut_down()
    protocol = {n for n, v in vars(Store).items() if callable(v) and not n.startswith("_")}
    assert protocol <= called, f"not exercised: {protocol - called}"
    groups = {"leases": "coordination.k8s.io", "configmaps": ""}
    sent = {(groups[resource], resource, verb) for verb, resource in server.requests}
    role = find(resources, "Role", "inferway-fleet-store")
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == sent
