"""deploy/kubernetes/components/{keda,hpa}, checked without a cluster: each renders (here and
with ``kubectl kustomize``) into an overlay as docs/kubernetes.md says to add it; the HPA is
valid against the Kubernetes 1.37 schemas (kubernetes-validate, strict); the ScaledObject,
a KEDA CRD that kubernetes-validate does not know, against a hand-written subset of KEDA's
keda.sh/v1alpha1 ScaledObject CRD schema (the fields used here, with the CRD's types and
required fields; anything else refused); the prometheus-adapter rule against the fields of
its config file. Both act on the metric the gateway really exports, for a service of the
policy, and scale the backend Deployment within what its PodDisruptionBudget allows. That
the two queries return the published count from a real Prometheus is
tests/integration/test_autoscale_queries_prometheus.py."""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from inferway.gateway.autoscale_admin import register_autoscale_metrics
from tests.kustomize_build import KustomizeError, build
from tests.prometheus_text import parse_exposition, wire_names

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ROOT / "deploy" / "kubernetes" / "components"
ADAPTER_RULES = COMPONENTS / "hpa" / "prometheus-adapter-rules.yaml"
OVERLAYS = {
    "keda": ROOT / "tests" / "data" / "kustomize" / "keda",
    "hpa": ROOT / "tests" / "data" / "kustomize" / "hpa",
}
KUBERNETES_VERSION = "1.37.0"

Resource = dict[str, Any]

_INT32 = {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1}
_POLICY = {
    "type": "object",
    "required": ["periodSeconds", "type", "value"],
    "additionalProperties": False,
    "properties": {"periodSeconds": _INT32, "type": {"type": "string"}, "value": _INT32},
}
_RULES = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "policies": {"type": "array", "items": _POLICY},
        "selectPolicy": {"type": "string"},
        "stabilizationWindowSeconds": _INT32,
    },
}
# keda.sh/v1alpha1 ScaledObject: the subset of KEDA's CRD (config/crd/bases/
# keda.sh_scaledobjects.yaml) that components/keda uses, same types and required fields.
SCALED_OBJECT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {
            "type": "object",
            "required": ["name", "namespace"],
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                "namespace": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "additionalProperties": False,
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "additionalProperties": False,
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "name": {"type": "string"},
                    },
                },
                "pollingInterval": _INT32,
                "cooldownPeriod": _INT32,
                "minReplicaCount": _INT32,
                "maxReplicaCount": _INT32,
                "fallback": {
                    "type": "object",
                    "required": ["failureThreshold", "replicas"],
                    "additionalProperties": False,
                    "properties": {"failureThreshold": _INT32, "replicas": _INT32},
                },
                "advanced": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "horizontalPodAutoscalerConfig": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "behavior": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "properties": {"scaleUp": _RULES, "scaleDown": _RULES},
                                }
                            },
                        }
                    },
                },
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["metadata", "type"],
                        "additionalProperties": False,
                        "properties": {
                            "type": {"type": "string"},
                            "name": {"type": "string"},
                            "metricType": {"enum": ["Value", "AverageValue", "Utilization"]},
                            "metadata": {
                                "type": "object",
                                "additionalProperties": {"type": "string"},
                            },
                        },
                    },
                },
            },
        },
    },
}
# KEDA's prometheus scaler reads these metadata keys (keda.sh/docs scalers/prometheus); the
# CRD types metadata only as a string map, so a misspelt key would pass it unnoticed.
PROMETHEUS_TRIGGER_REQUIRED = {"serverAddress", "query", "threshold"}
PROMETHEUS_TRIGGER_KEYS = PROMETHEUS_TRIGGER_REQUIRED | {
    "activationThreshold",
    "ignoreNullValues",
    "namespace",
    "unsafeSsl",
    "customHeaders",
}
# prometheus-adapter's config file (pkg/config): the fields of an external rule used here.
ADAPTER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["externalRules"],
    "additionalProperties": False,
    "properties": {
        "externalRules": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["seriesQuery", "metricsQuery"],
                "additionalProperties": False,
                "properties": {
                    "seriesQuery": {"type": "string"},
                    "metricsQuery": {"type": "string"},
                    "resources": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "overrides": {
                                "type": "object",
                                "additionalProperties": {
                                    "type": "object",
                                    "required": ["resource"],
                                    "additionalProperties": False,
                                    "properties": {"resource": {"type": "string"}},
                                },
                            }
                        },
                    },
                    "name": {
                        "type": "object",
                        "required": ["matches"],
                        "additionalProperties": False,
                        "properties": {"matches": {"type": "string"}, "as": {"type": "string"}},
                    },
                },
            },
        }
    },
}


def validate_object(resource: Resource) -> None:
    if resource["kind"] == "ScaledObject":
        jsonschema.validate(resource, SCALED_OBJECT_SCHEMA)
        for trigger in resource["spec"]["triggers"]:
            if trigger["type"] == "prometheus":
                keys = set(trigger["metadata"])
                assert keys >= PROMETHEUS_TRIGGER_REQUIRED, trigger
                assert keys <= PROMETHEUS_TRIGGER_KEYS, keys - PROMETHEUS_TRIGGER_KEYS
    elif resource["kind"] != "ServiceMonitor":  # test_kubernetes_manifests checks those
        kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)


def find(resources: list[Resource], kind: str, name: str) -> Resource:
    found = [r for r in resources if r["kind"] == kind and r["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def exported_desired_metric() -> str:
    """The name the gateway's autoscaler collector really puts on /metrics."""

    class Driver:
        def desired(self) -> dict[str, int]:
            return {"model": 3}

    registry = CollectorRegistry()
    register_autoscale_metrics(registry, Driver())  # type: ignore[arg-type]
    (name,) = wire_names(parse_exposition(generate_latest(registry).decode()))
    return name


def published_services(resources: list[Resource]) -> dict[str, tuple[int, int]]:
    """The policy's services whose decision the gateway publishes (``scale_target: metric``)
    -> their autoscale (min_replicas, max_replicas)."""
    policy = yaml.safe_load(find(resources, "ConfigMap", "inferway-policy")["data"]["policy.yaml"])
    return {
        s["name"]: (s["autoscale"]["min_replicas"], s["autoscale"]["max_replicas"])
        for s in policy["services"]
        if (s.get("autoscale") or {}).get("scale_target") == "metric"
    }


@pytest.fixture(scope="module", params=sorted(OVERLAYS))
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[Resource]]:
    return request.param, build(OVERLAYS[request.param])


def _normalised(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _normalised(v) for k, v in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(v, dict) and "name" in v for v in value):
            return {v["name"]: _normalised(v) for v in value}
        return [_normalised(v) for v in value]
    return value


@pytest.mark.needs_binary("kubectl", "comparing with kubectl kustomize")
@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_the_python_render_of_the_components_matches_kubectl_kustomize(overlay: str) -> None:
    done = subprocess.run(
        ["kubectl", "kustomize", str(OVERLAYS[overlay])],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    theirs = {
        (d["kind"], d["metadata"]["name"]): _normalised(d)
        for d in yaml.safe_load_all(done.stdout)
        if d
    }
    ours = {(r["kind"], r["metadata"]["name"]): _normalised(r) for r in build(OVERLAYS[overlay])}
    assert ours == theirs


def test_a_component_is_not_built_on_its_own() -> None:
    with pytest.raises(KustomizeError, match="Component is not built on its own"):
        build(COMPONENTS / "keda")


def test_every_object_of_an_overlay_with_a_component_is_valid(
    rendered: tuple[str, list[Resource]],
) -> None:
    overlay, resources = rendered
    scalers = [r for r in resources if r["kind"] in ("ScaledObject", "HorizontalPodAutoscaler")]
    assert [s["kind"] for s in scalers] == [
        {"keda": "ScaledObject", "hpa": "HorizontalPodAutoscaler"}[overlay]
    ]
    for resource in resources:
        validate_object(resource)
        if resource["kind"] != "Namespace":
            assert resource["metadata"]["namespace"] == "inferway", resource["metadata"]


def test_the_validation_refuses_a_misspelt_or_mistyped_scaled_object() -> None:
    scaled = find(build(OVERLAYS["keda"]), "ScaledObject", "inferway-backend")
    for path, value in (
        (("spec", "minReplicas"), 2),  # the HPA's spelling, not KEDA's
        (("spec", "maxReplicaCount"), "16"),
        (("spec", "fallback", "replica"), 2),
        (("spec", "triggers", 0, "metricType"), "Average"),
    ):
        broken = copy.deepcopy(scaled)
        target: Any = broken
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        with pytest.raises(jsonschema.ValidationError):
            validate_object(broken)
    broken = copy.deepcopy(scaled)
    broken["spec"]["triggers"][0]["metadata"]["treshold"] = "1"
    with pytest.raises(AssertionError):
        validate_object(broken)
    hpa = copy.deepcopy(find(build(OVERLAYS["hpa"]), "HorizontalPodAutoscaler", "inferway-backend"))
    hpa["spec"]["metrics"][0]["external"]["target"]["averageValue"] = [1]
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_object(hpa)


def test_each_scaler_sizes_the_backend_within_its_disruption_budget(
    rendered: tuple[str, list[Resource]],
) -> None:
    _, resources = rendered
    backend = find(resources, "Deployment", "inferway-backend")
    budget = find(resources, "PodDisruptionBudget", "inferway-backend")
    for scaler in (
        r for r in resources if r["kind"] in ("ScaledObject", "HorizontalPodAutoscaler")
    ):
        spec = scaler["spec"]
        target = spec["scaleTargetRef"]
        assert (target["apiVersion"], target["kind"]) == ("apps/v1", "Deployment")
        assert target["name"] == backend["metadata"]["name"]
        low = spec.get("minReplicaCount", spec.get("minReplicas"))
        high = spec.get("maxReplicaCount", spec.get("maxReplicas"))
        assert budget["spec"]["maxUnavailable"] < low <= high, (low, high)
        if "fallback" in spec:
            assert low <= spec["fallback"]["replicas"] <= high


def test_keda_takes_the_published_count_as_the_replica_count() -> None:
    resources = build(OVERLAYS["keda"])
    scaled = find(resources, "ScaledObject", "inferway-backend")
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"]["threshold"] == "1", "desired = ceil(value / threshold)"
    query = trigger["metadata"]["query"]
    # max: only the leader publishes; a hand-over's overlap must not double the count
    match = re.fullmatch(r'max\((\w+)\{namespace="(\w+)",service="([\w-]+)"\}\)', query)
    assert match, query
    metric, namespace, service = match.groups()
    assert metric == exported_desired_metric()
    assert namespace == scaled["metadata"]["namespace"]
    bounds = (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"])
    assert published_services(resources)[service] == bounds, "the series exists, same bounds"


def test_the_hpa_takes_the_published_count_through_the_adapter_rule() -> None:
    resources = build(OVERLAYS["hpa"])
    hpa = find(resources, "HorizontalPodAutoscaler", "inferway-backend")
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "External"
    external = metric["external"]
    assert external["target"] == {"type": "AverageValue", "averageValue": "1"}
    assert external["metric"]["name"] == exported_desired_metric()
    (service,) = external["metric"]["selector"]["matchLabels"].values()
    bounds = (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"])
    assert published_services(resources)[service] == bounds, "the series exists, same bounds"
    rules = yaml.safe_load(ADAPTER_RULES.read_text())
    jsonschema.validate(rules, ADAPTER_SCHEMA)
    (rule,) = rules["externalRules"]
    assert rule["name"]["as"] == external["metric"]["name"]
    assert re.fullmatch(rule["name"]["matches"], exported_desired_metric())
    assert rule["seriesQuery"].startswith(exported_desired_metric() + "{")
    assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}}
