"""The actuator each ``scale_target`` selects, and what each reads and sends: the replica
manager's counts, Envoy's healthy hosts (publish only), and the Deployment's Scale through
the real kubernetes client down to its HTTP pool (tests/kubernetes_pool.py: no API server
can run here), with every refusal a ScaleActuatorError whose message says what to change."""

from __future__ import annotations

from typing import Any

import pytest
import urllib3
from kubernetes import config as k8s_config

from inferway.gateway.actuators.kubernetes_scale import KubernetesScaler, ScaleTarget
from inferway.gateway.actuators.replicas import ReplicaManager
from inferway.gateway.actuators.scale_actuators import (
    Counts,
    KubernetesActuator,
    MetricActuator,
    ReplicaActuator,
    ScaleActuatorError,
    select_actuator,
)
from inferway.gateway.autoscaling import AutoscaleDriver
from inferway.gateway.loop_configs import compile_loops
from inferway.policies import load_policy_text
from inferway.policies.scale_target import ScaleTargetSpec
from tests.kubernetes_pool import HOST, ScalePool, scaler_on

SCALE = f"{HOST}/apis/apps/v1/namespaces/inferway/deployments/inferway-backend/scale"


def _manager() -> ReplicaManager:
    return ReplicaManager(lambda _replicas: None)


def _kubernetes(pool: ScalePool) -> Any:
    return lambda service, target: scaler_on(pool, service, target)


def test_each_target_selects_its_actuator() -> None:
    manager = _manager()
    replicas = select_actuator("m", ScaleTargetSpec("replicas"), manager)
    assert isinstance(replicas, ReplicaActuator) and replicas.manager is manager
    assert isinstance(select_actuator("m", ScaleTargetSpec("metric"), manager), MetricActuator)
    kube = select_actuator(
        "m", ScaleTargetSpec("kubernetes", "inferway-backend", "inferway"), manager
    )
    assert isinstance(kube, KubernetesActuator)
    assert kube.describe() == {
        "kind": "kubernetes",
        "deployment": "inferway-backend",
        "namespace": "inferway",
    }


async def test_the_replica_actuator_refuses_a_service_it_does_not_run() -> None:
    actuator = ReplicaActuator(_manager())
    with pytest.raises(ScaleActuatorError, match="runs no replicas of 'm'"):
        await actuator.counts("m", 3)
    with pytest.raises(ScaleActuatorError, match="m"):
        await actuator.scale_to("m", 2, "test")


async def test_the_metric_actuator_counts_envoy_s_healthy_hosts_and_actuates_nothing() -> None:
    actuator = MetricActuator()
    assert await actuator.counts("m", 3) == Counts(3, 3)
    assert await actuator.counts("m", 0) == Counts(0, 0)
    with pytest.raises(ScaleActuatorError, match="no membership of cluster 'm'"):
        await actuator.counts("m", None)
    await actuator.scale_to("m", 5, "published only")


async def test_the_kubernetes_actuator_reads_the_scale_and_patches_spec_replicas() -> None:
    pool = ScalePool("inferway-backend", "inferway", spec=2, ready=1)
    actuator = KubernetesActuator("m", "inferway-backend", "inferway", _kubernetes(pool))
    assert await actuator.counts("m", None) == Counts(2, 1)
    await actuator.scale_to("m", 4, "in_flight 8 / target 2")
    get, patch = pool.requests
    assert (get.method, get.url, get.body) == ("GET", SCALE, None)
    assert (patch.method, patch.url) == ("PATCH", SCALE)
    assert patch.headers["Content-Type"] == "application/merge-patch+json"
    assert patch.body == {"spec": {"replicas": 4}}
    assert await actuator.counts("m", None) == Counts(4, 1)


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (403, "not allowed to patch deployment inferway/inferway-backend/scale (403"),
        (404, "deployment inferway/inferway-backend not found"),
        (500, "patch deployment inferway/inferway-backend/scale: 500"),
    ],
)
async def test_an_api_refusal_is_an_actuator_error_that_says_what_to_change(
    code: int, words: str
) -> None:
    pool = ScalePool("inferway-backend", "inferway", spec=2, ready=2, refuse=[code])
    actuator = KubernetesActuator("m", "inferway-backend", "inferway", _kubernetes(pool))
    with pytest.raises(ScaleActuatorError) as caught:
        await actuator.scale_to("m", 3, "test")
    assert words in str(caught.value)
    assert pool.spec == 2


async def test_a_missing_deployment_on_read_is_an_actuator_error() -> None:
    pool = ScalePool("other", "inferway", spec=2, ready=2)
    actuator = KubernetesActuator("m", "inferway-backend", "inferway", _kubernetes(pool))
    with pytest.raises(ScaleActuatorError, match="inferway/inferway-backend not found"):
        await actuator.counts("m", None)


class _Unreachable:
    def request(self, method: str, url: str, **kwargs: Any) -> urllib3.HTTPResponse:
        raise urllib3.exceptions.MaxRetryError(None, url, "connection refused")  # type: ignore[arg-type]


async def test_an_unreachable_api_server_is_an_actuator_error() -> None:
    def factory(service: str, target: ScaleTarget) -> KubernetesScaler:
        scaler = scaler_on(ScalePool(target.deployment, target.namespace, 1, 1), service, target)
        scaler._api.api_client.rest_client.pool_manager = _Unreachable()
        return scaler

    actuator = KubernetesActuator("m", "inferway-backend", "inferway", factory)
    with pytest.raises(ScaleActuatorError, match="Kubernetes API unreachable: MaxRetryError"):
        await actuator.counts("m", None)


async def test_no_client_configuration_is_an_actuator_error_not_a_crash() -> None:
    def factory(service: str, target: ScaleTarget) -> KubernetesScaler:
        raise k8s_config.ConfigException("Service host/port is not set.")

    actuator = KubernetesActuator("m", "inferway-backend", "inferway", factory)
    with pytest.raises(ScaleActuatorError, match="no Kubernetes client configuration"):
        await actuator.scale_to("m", 2, "test")


POLICY = """
listeners: [{name: main, port: 10000}]
services:
  - name: published
    endpoints: [{host: 127.0.0.1, port: 8000}]
    autoscale: {metric: in_flight, target: 2, scale_target: metric}
  - name: deployed
    endpoints: [{host: 127.0.0.1, port: 8001}]
    autoscale:
      metric: request_rate
      target: 10
      scale_target: {kubernetes: {deployment: inferway-backend, namespace: inferway}}
  - name: fixed
    endpoints: [{host: 127.0.0.1, port: 8002}]
routes:
  - {name: a, match: {path: {prefix: /a}}, backends: [{service: published}]}
  - {name: b, match: {path: {prefix: /b}}, backends: [{service: deployed}]}
  - {name: c, backends: [{service: fixed}]}
"""


def test_the_driver_takes_every_autoscaled_service_with_its_target() -> None:
    driver = AutoscaleDriver(_manager(), lambda: None)
    driver.configure(compile_loops(load_policy_text(POLICY, "p.yaml")))
    shown = {s["service"]: s["scale_target"] for s in driver.status_json()["services"]}
    assert shown == {
        "published": {"kind": "metric"},
        "deployed": {
            "kind": "kubernetes",
            "deployment": "inferway-backend",
            "namespace": "inferway",
        },
    }
