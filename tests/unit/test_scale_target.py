"""``autoscale.scale_target``: what a decision acts on, and every bad pairing with
``replicas:`` a located error (file:line:column) when the policy loads."""

from __future__ import annotations

import pytest

from inferway.gateway.autoscale_policy import autoscale_configs
from inferway.policies import PolicyError, load_policy_text
from inferway.policies.scale_target import ScaleTargetSpec, read_scale_target

ENDPOINTS = "    endpoints: [{host: 127.0.0.1, port: 8000}]\n"
REPLICAS = "    replicas: {command: 'serve {port}', min: 1, max: 4}\n"
TAIL = "routes:\n  - name: all\n    backends: [{service: m}]\n"


def _policy(source: str, *autoscale: str) -> str:
    head = "listeners: [{name: main, port: 10000}]\nservices:\n  - name: m\n" + source
    block = "    autoscale:\n" + "".join(f"      {line}\n" for line in autoscale)
    return head + block + TAIL


def _errors(text: str) -> list[str]:
    with pytest.raises(PolicyError) as caught:
        load_policy_text(text, "p.yaml")
    return [str(issue) for issue in caught.value.issues]


RULE = ("metric: in_flight", "target: 2")


@pytest.mark.parametrize(
    ("source", "target", "expected"),
    [
        (REPLICAS, None, ScaleTargetSpec("replicas")),
        (REPLICAS, "scale_target: replicas", ScaleTargetSpec("replicas")),
        (ENDPOINTS, "scale_target: metric", ScaleTargetSpec("metric")),
        (
            ENDPOINTS,
            "scale_target: {kubernetes: {deployment: inferway-backend, namespace: inferway}}",
            ScaleTargetSpec("kubernetes", "inferway-backend", "inferway"),
        ),
    ],
)
def test_each_target_loads_and_the_rule_still_builds(
    source: str, target: str | None, expected: ScaleTargetSpec
) -> None:
    lines = (*RULE, target) if target else RULE
    text = _policy(source, *lines)
    policy = load_policy_text(text, "p.yaml")
    (service,) = policy.services
    assert service.autoscale is not None
    spec = read_scale_target(service.autoscale, has_replicas=service.replicas is not None)
    assert spec == expected
    (config,) = autoscale_configs(policy).values()
    assert (config.metric, getattr(config.params, "target", None)) == ("in_flight", 2.0)


def test_the_rule_form_takes_a_scale_target_too() -> None:
    text = _policy(
        ENDPOINTS,
        "scaling_policy: {metric_type: in_flight, threshold: 4, action: add_instance}",
        "scale_target: metric",
    )
    policy = load_policy_text(text, "p.yaml")
    assert autoscale_configs(policy)["m"].algorithm == "threshold"


@pytest.mark.parametrize(
    ("source", "target", "where", "words"),
    [
        (ENDPOINTS, None, "p.yaml:5:5: services[0].autoscale:", "without replicas"),
        (ENDPOINTS, "scale_target: replicas", "p.yaml:8:21: ", "needs a replicas: section"),
        (REPLICAS, "scale_target: metric", "p.yaml:8:21: ", "remove replicas:"),
        (
            REPLICAS,
            "scale_target: {kubernetes: {deployment: d, namespace: n}}",
            "p.yaml:8:21: ",
            "sizes replicas something else runs",
        ),
        (ENDPOINTS, "scale_target: hpa", "p.yaml:8:21: ", "unknown scale_target 'hpa'"),
        (ENDPOINTS, "scale_target: 3", "p.yaml:8:21: ", "got int"),
        (ENDPOINTS, "scale_target: {keda: {}}", "p.yaml:8:21: ", "exactly one key"),
        (
            ENDPOINTS,
            "scale_target: {kubernetes: {deployment: Backend_1, namespace: inferway}}",
            "p.yaml:8:47: services[0].autoscale.scale_target.kubernetes.deployment",
            "not a DNS subdomain",
        ),
        (
            ENDPOINTS,
            "scale_target: {kubernetes: {deployment: backend}}",
            "services[0].autoscale.scale_target.kubernetes:",
            "namespace is required",
        ),
        (
            ENDPOINTS,
            "scale_target: {kubernetes: {deployment: b, namespace: n, replicas: 2}}",
            "services[0].autoscale.scale_target.kubernetes.replicas",
            "unknown key",
        ),
    ],
)
def test_a_bad_target_or_pairing_is_a_located_error(
    source: str, target: str | None, where: str, words: str
) -> None:
    lines = (*RULE, target) if target else RULE
    errors = _errors(_policy(source, *lines))
    assert len(errors) == 1 and where in errors[0] and words in errors[0], errors


@pytest.mark.parametrize(
    "rule",
    [
        ("metric: queue_length", "target: 10"),
        ("scaling_policy: {metric_type: utilization, threshold: 0.8, action: add_instance}",),
    ],
)
def test_replica_metrics_need_the_gateway_s_own_replicas(rule: tuple[str, ...]) -> None:
    (error,) = _errors(_policy(ENDPOINTS, *rule, "scale_target: metric"))
    assert "p.yaml:6:" in error and "only the gateway's own replicas" in error, error


def test_the_queue_wait_is_a_replica_metric_too() -> None:
    text = _policy(ENDPOINTS, "metric: queue_wait", "target: 0.3", "scale_target: metric")
    (error,) = _errors(text)
    assert "services[0].autoscale.metric: queue_wait is read from each replica" in error
    policy = load_policy_text(_policy(REPLICAS, "metric: queue_wait", "target: 0.3"), "p.yaml")
    assert autoscale_configs(policy)["m"].metric == "queue_wait"
