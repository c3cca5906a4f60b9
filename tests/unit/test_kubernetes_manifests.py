"""deploy/kubernetes, checked without a cluster: each overlay renders (here in Python, and the
same as ``kubectl kustomize`` where that exists), every rendered object is valid against the
Kubernetes 1.37 OpenAPI schemas (kubernetes-validate, strict: unknown fields are errors) or,
for the Prometheus Operator's ServiceMonitor, against the subset of its CRD schema we use; the
objects agree with each other (selectors, port names, the policy's DNS names) and with the
CLI (the containers' arguments parse as ``inferway`` options, the policy passes ``inferway
validate``)."""

from __future__ import annotations

import copy
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import typer
import yaml

from inferway.cli.main import app
from inferway.gateway.admin_documents import ADMIN_TOKEN_ENV
from tests.kustomize_build import build

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
OVERLAYS = {"cpu": KUBERNETES / "overlays" / "cpu", "gpu": KUBERNETES / "overlays" / "gpu"}
KUBERNETES_VERSION = "1.37.0"

Resource = dict[str, Any]

# The fields of monitoring.coreos.com/v1 ServiceMonitor these manifests use, with the CRD's
# types and its Duration pattern; anything else is refused (kubernetes-validate has no CRDs).
_DURATION = (
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
SERVICE_MONITOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                "namespace": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "matchLabels": {
                            "type": "object",
                            "additionalProperties": {"type": "string"},
                        }
                    },
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["port"],
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string", "pattern": "^/"},
                            "interval": {"type": "string", "pattern": _DURATION},
                            "authorization": {
                                "type": "object",
                                "required": ["credentials"],
                                "additionalProperties": False,
                                "properties": {
                                    "type": {"type": "string"},
                                    "credentials": {
                                        "type": "object",
                                        "required": ["key"],
                                        "additionalProperties": False,
                                        "properties": {
                                            "name": {"type": "string"},
                                            "key": {"type": "string"},
                                            "optional": {"type": "boolean"},
                                        },
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


@pytest.fixture(scope="module", params=sorted(OVERLAYS))
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[Resource]]:
    return request.param, build(OVERLAYS[request.param])


def find(resources: list[Resource], kind: str, name: str) -> Resource:
    found = [r for r in resources if r["kind"] == kind and r["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def container(deployment: Resource, name: str, init: bool = False) -> dict[str, Any]:
    pod = deployment["spec"]["template"]["spec"]
    return next(c for c in pod["initContainers" if init else "containers"] if c["name"] == name)


def env_of(c: dict[str, Any]) -> dict[str, str]:
    """The container's literal environment values (not those read from a Secret)."""
    return {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}


def validate_object(resource: Resource) -> None:
    if resource["kind"] == "ServiceMonitor":
        jsonschema.validate(resource, SERVICE_MONITOR_SCHEMA)
    else:
        kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)


# -- rendering ----------------------------------------------------------------------------------


def _normalised(value: Any) -> Any:
    """Lists of named items as maps, so strategic-merge order does not count."""
    if isinstance(value, dict):
        return {k: _normalised(v) for k, v in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(v, dict) and "name" in v for v in value):
            return {v["name"]: _normalised(v) for v in value}
        return [_normalised(v) for v in value]
    return value


def _by_identity(resources: list[Resource]) -> dict[tuple[str, str], Any]:
    return {(r["kind"], r["metadata"]["name"]): _normalised(r) for r in resources}


@pytest.mark.needs_binary("kubectl", "comparing with kubectl kustomize")
@pytest.mark.parametrize("directory", [KUBERNETES / "base", *OVERLAYS.values()], ids=str)
def test_the_python_render_matches_kubectl_kustomize(directory: Path) -> None:
    done = subprocess.run(
        ["kubectl", "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    theirs = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert _by_identity(build(directory)) == _by_identity(theirs)


def test_every_rendered_object_is_valid(rendered: tuple[str, list[Resource]]) -> None:
    _, resources = rendered
    kinds = Counter(r["kind"] for r in resources)
    assert kinds == {"Namespace": 1} | dict.fromkeys(
        ["ConfigMap", "Deployment", "Service", "PodDisruptionBudget", "ServiceMonitor"], 2
    )
    for resource in resources:
        validate_object(resource)
        if resource["kind"] != "Namespace":
            assert resource["metadata"]["namespace"] == "inferway", resource["metadata"]


def test_the_validation_refuses_unknown_fields_and_bad_values() -> None:
    resources = build(OVERLAYS["cpu"])
    deployment = copy.deepcopy(find(resources, "Deployment", "inferway-backend"))
    deployment["spec"]["replcas"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_object(deployment)
    deployment = copy.deepcopy(find(resources, "Deployment", "inferway-backend"))
    container(deployment, "backend")["readinessProbe"]["httpGet"]["port"] = [8000]
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_object(deployment)
    monitor = copy.deepcopy(find(resources, "ServiceMonitor", "inferway-backend"))
    monitor["spec"]["endpoints"][0]["interval"] = "15 seconds"
    with pytest.raises(jsonschema.ValidationError):
        validate_object(monitor)


# -- the objects agree with each other ----------------------------------------------------------


def _port_number(c: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in c["ports"] if p["name"] == port)


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def test_services_budgets_and_monitors_select_their_pods_by_real_ports(
    rendered: tuple[str, list[Resource]],
) -> None:
    _, resources = rendered
    deployments = [r for r in resources if r["kind"] == "Deployment"]
    for deployment in deployments:
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert _selects(deployment["spec"]["selector"]["matchLabels"], pod_labels)
        name = deployment["metadata"]["name"]
        budget = find(resources, "PodDisruptionBudget", name)
        assert _selects(budget["spec"]["selector"]["matchLabels"], pod_labels)
        assert deployment["spec"]["replicas"] > budget["spec"]["maxUnavailable"]
        service = find(resources, "Service", name)
        assert _selects(service["spec"]["selector"], pod_labels)
        main = deployment["spec"]["template"]["spec"]["containers"][0]
        container_ports = {p["name"] for p in main["ports"]}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports
        monitor = find(resources, "ServiceMonitor", name)
        assert _selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
        service_ports = {p["name"] for p in service["spec"]["ports"]}
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= service_ports
    scrape = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yaml").read_text())
    paths = {job["metrics_path"] for job in scrape["scrape_configs"]}
    monitored = {
        e["path"]
        for r in resources
        if r["kind"] == "ServiceMonitor"
        for e in r["spec"]["endpoints"]
    }
    assert monitored == paths


def test_backend_probes_are_the_oip_health_endpoints_on_the_served_port(
    rendered: tuple[str, list[Resource]],
) -> None:
    _, resources = rendered
    backend = container(find(resources, "Deployment", "inferway-backend"), "backend")
    env = env_of(backend)
    for probe, path in (
        ("startupProbe", "/v2/health/live"),
        ("livenessProbe", "/v2/health/live"),
        ("readinessProbe", "/v2/health/ready"),
    ):
        get = backend[probe]["httpGet"]
        assert get["path"] == path, probe
        assert _port_number(backend, get["port"]) == int(env["INFERWAY_HTTP_PORT"]), probe
    assert {p["containerPort"] for p in backend["ports"]} == {
        int(env["INFERWAY_HTTP_PORT"]),
        int(env["INFERWAY_GRPC_PORT"]),
    }


def test_only_the_gpu_overlay_asks_for_a_gpu(rendered: tuple[str, list[Resource]]) -> None:
    overlay, resources = rendered
    for deployment in (r for r in resources if r["kind"] == "Deployment"):
        for c in deployment["spec"]["template"]["spec"]["containers"]:
            resources_of = c["resources"]
            gpus = {k: v.get("nvidia.com/gpu") for k, v in resources_of.items()}
            wanted = "1" if (overlay, c["name"]) == ("gpu", "backend") else None
            assert gpus == {"requests": wanted, "limits": wanted}, (overlay, c["name"])
            assert "cpu" in resources_of["requests"] and "memory" in resources_of["limits"]
    init = container(find(resources, "Deployment", "inferway-backend"), "model-repository", True)
    assert env_of(init)["INFERWAY_PROVIDER"] == overlay.replace("gpu", "cuda")


# -- the objects agree with the CLI and the policy ----------------------------------------------


def parse_cli(args: list[str]) -> dict[str, Any]:
    """The options ``inferway ARGS`` would run with (parsed, type-checked, not run)."""
    group = typer.main.get_command(app)
    command = group.get_command(group.make_context("inferway", list(args)), args[0])  # type: ignore[attr-defined]
    assert command is not None, args
    return command.make_context(args[0], list(args[1:])).params


def policy_of(resources: list[Resource]) -> tuple[Path, str]:
    """The policy file the gateway container reads and its text, found through its volume."""
    gateway = find(resources, "Deployment", "inferway-gateway")
    main = container(gateway, "gateway")
    policy_path = Path(parse_cli(main["args"])["file"])
    mount = next(m for m in main["volumeMounts"] if policy_path.parent == Path(m["mountPath"]))
    volume = next(
        v for v in gateway["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]
    )
    config_map = find(resources, "ConfigMap", volume["configMap"]["name"])
    return policy_path, config_map["data"][policy_path.name]


def test_container_arguments_parse_as_inferway_options(
    rendered: tuple[str, list[Resource]],
) -> None:
    _, resources = rendered
    gateway = container(find(resources, "Deployment", "inferway-gateway"), "gateway")
    options = parse_cli(gateway["args"])
    assert options["admin_address"] == "0.0.0.0"
    assert (
        _port_number(gateway, gateway["livenessProbe"]["httpGet"]["port"])
        == (options["admin_port"])
    )
    mounts = {m["mountPath"] for m in gateway["volumeMounts"]}
    assert str(options["workdir"]) in mounts, "the workdir must be writable (an emptyDir)"
    backend = container(find(resources, "Deployment", "inferway-backend"), "backend")
    assert parse_cli(backend["args"]) is not None


def test_the_gateway_and_the_envoy_stats_scrape_share_the_admin_token_secret(
    rendered: tuple[str, list[Resource]],
) -> None:
    """Off loopback the admin API wants its token for every read but /healthz and /metrics:
    the gateway reads it from a Secret (no committed token, no pod without it) and the
    ServiceMonitor's Envoy-stats endpoint sends the same Secret's key as a bearer token."""
    _, resources = rendered
    gateway = container(find(resources, "Deployment", "inferway-gateway"), "gateway")
    assert parse_cli(gateway["args"])["admin_address"] == "0.0.0.0"
    (token,) = [e for e in gateway["env"] if e["name"] == ADMIN_TOKEN_ENV]
    reference = token["valueFrom"]["secretKeyRef"]
    assert "optional" not in reference, "the gateway must not start without its token"
    assert not [r for r in resources if r["kind"] == "Secret"], "the token is not committed"
    monitor = find(resources, "ServiceMonitor", "inferway-gateway")
    by_path = {e["path"]: e for e in monitor["spec"]["endpoints"]}
    assert "authorization" not in by_path["/metrics"]
    authorization = by_path["/envoy/stats/prometheus"]["authorization"]
    assert authorization == {
        "type": "Bearer",
        "credentials": {"name": reference["name"], "key": reference["key"]},
    }
    assert monitor["metadata"]["namespace"] == gateway_namespace(resources)


def gateway_namespace(resources: list[Resource]) -> str:
    """The namespace the gateway's pods (and so the Secret they read) live in."""
    namespace: str = find(resources, "Deployment", "inferway-gateway")["metadata"]["namespace"]
    return namespace


def test_the_policy_passes_inferway_validate_and_names_the_headless_backend_service(
    rendered: tuple[str, list[Resource]], tmp_path: Path
) -> None:
    _, resources = rendered
    policy_path, text = policy_of(resources)
    policy_file = tmp_path / policy_path.name
    policy_file.write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "inferway.cli.main", "validate", "-f", str(policy_file)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    policy = yaml.safe_load(text)
    gateway = container(find(resources, "Deployment", "inferway-gateway"), "gateway")
    listener_ports = {listener["port"] for listener in policy["listeners"]}
    assert _port_number(gateway, gateway["readinessProbe"]["tcpSocket"]["port"]) in listener_ports
    for service in policy["services"]:
        for endpoint in service["endpoints"]:
            host, port = endpoint.rsplit(":", 1)
            name, namespace, *domain = host.split(".")
            assert domain == ["svc", "cluster", "local"], endpoint
            target = find(resources, "Service", name)
            assert target["metadata"]["namespace"] == namespace, endpoint
            assert target["spec"]["clusterIP"] == "None", f"{name} must be headless (STRICT_DNS)"
            assert int(port) in {p["port"] for p in target["spec"]["ports"]}, endpoint


def test_every_backend_variable_sets_a_serve_option(
    rendered: tuple[str, list[Resource]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, resources = rendered
    backend = container(find(resources, "Deployment", "inferway-backend"), "backend")
    group = typer.main.get_command(app)
    serve = group.get_command(group.make_context("inferway", ["serve"]), "serve")  # type: ignore[attr-defined]
    by_variable = {p.envvar: p.name for p in serve.params if p.envvar}
    env = env_of(backend)
    assert set(env) <= set(by_variable), f"variables no option reads: {set(env) - set(by_variable)}"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    options = parse_cli(backend["args"])
    for name, value in env.items():
        assert str(options[by_variable[name]]) == value, name


# -- the backend's init script ------------------------------------------------------------------

SCRIPT = KUBERNETES / "base" / "write_model_defaults.py"


def run_script(store: Path, repository: Path, **variables: str) -> subprocess.CompletedProcess[str]:
    env = {"INFERWAY_MODEL_STORE": str(store), "INFERWAY_MODEL_REPOSITORY": str(repository)}
    return subprocess.run(
        [sys.executable, str(SCRIPT)],
        env={**env, **variables, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_the_init_script_keeps_a_model_s_own_config_and_names_a_bad_variable(
    tmp_path: Path,
) -> None:
    store, repository = tmp_path / "store", tmp_path / "models"
    (store / "own" / "1").mkdir(parents=True)
    (store / "own" / "config.yaml").write_text("batching: {mode: off}\n")
    (store / "plain" / "1").mkdir(parents=True)
    done = run_script(store, repository, INFERWAY_MAX_BATCH_SIZE="8", INFERWAY_PROVIDER="cpu")
    assert done.returncode == 0, done.stderr
    assert (repository / "own" / "config.yaml").is_symlink()
    assert (repository / "own" / "config.yaml").read_text() == "batching: {mode: off}\n"
    assert yaml.safe_load((repository / "plain" / "config.yaml").read_text()) == {
        "batching": {"max_batch_size": 8},
        "provider": "cpu",
    }
    assert (repository / "plain" / "1").resolve() == store / "plain" / "1"
    done = run_script(store, tmp_path / "again", INFERWAY_MAX_BATCH_SIZE="lots")
    assert done.returncode != 0
    assert "INFERWAY_MAX_BATCH_SIZE='lots': expected int" in done.stderr
    done = run_script(tmp_path / "missing", tmp_path / "again")
    assert done.returncode != 0 and "not a directory" in done.stderr
