"""The Kubernetes scale actuator, checked against the requests the official client really
builds: no API server can run here, so the client's urllib3 pool is replaced by one that
records each request (method, URL, headers, body) and answers with a Scale object as the API
server does (its JSON per the apps/v1 API). Everything above the pool (the client's
serialization, content-type choice, deserialization, ApiException) is the real client."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
import urllib3
from kubernetes import client as k8s

from inferway.gateway.actuators.kubernetes_scale import (
    KubernetesScaleError,
    KubernetesScaler,
    ScaleTarget,
)

HOST = "https://kubernetes.default.svc"


@dataclass
class Recorded:
    method: str
    url: str
    headers: dict[str, str]
    body: Any


@dataclass
class FakePool:
    """urllib3.PoolManager's ``request`` as the client calls it; answers are queued."""

    answers: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    requests: list[Recorded] = field(default_factory=list)

    def request(self, method: str, url: str, **kwargs: Any) -> urllib3.HTTPResponse:
        body = kwargs.get("body")
        self.requests.append(
            Recorded(method, url, dict(kwargs.get("headers") or {}), body and json.loads(body))
        )
        status, document = self.answers.pop(0)
        return urllib3.HTTPResponse(
            body=json.dumps(document).encode(),
            status=status,
            reason={200: "OK", 403: "Forbidden", 404: "Not Found", 500: "Internal Server Error"}[
                status
            ],
            headers={"Content-Type": "application/json"},
            preload_content=False,
        )


def scale_document(name: str, namespace: str, spec: int, ready: int) -> dict[str, Any]:
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": "42"},
        "spec": {"replicas": spec},
        "status": {"replicas": ready, "selector": "app.kubernetes.io/name=inferway-backend"},
    }


def status_document(code: int, reason: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason,
            "code": code}  # fmt: skip


@pytest.fixture
def pool() -> FakePool:
    return FakePool()


@pytest.fixture
def scaler(pool: FakePool) -> KubernetesScaler:
    configuration = k8s.Configuration(host=HOST)
    api_client = k8s.ApiClient(configuration)
    api_client.rest_client.pool_manager = pool
    targets = {
        "model": ScaleTarget("inferway-backend", "inferway"),
        "other": ScaleTarget("other-backend", "team-b"),
    }
    return KubernetesScaler(k8s.AppsV1Api(api_client), targets)


def test_scale_to_sends_a_merge_patch_of_spec_replicas_to_the_scale_subresource(
    pool: FakePool, scaler: KubernetesScaler
) -> None:
    pool.answers.append((200, scale_document("inferway-backend", "inferway", 5, 3)))
    stored = scaler.scale_to("model", 5, "in_flight 19 over target 4 per replica")
    (request,) = pool.requests
    assert request.method == "PATCH"
    assert (
        request.url == f"{HOST}/apis/apps/v1/namespaces/inferway/deployments/inferway-backend/scale"
    )
    assert request.headers["Content-Type"] == "application/merge-patch+json"
    assert request.headers["Accept"].startswith("application/json")
    assert request.body == {"spec": {"replicas": 5}}
    assert (stored.service, stored.desired, stored.ready) == ("model", 5, 3)


def test_status_reads_each_target_s_scale(pool: FakePool, scaler: KubernetesScaler) -> None:
    pool.answers += [
        (200, scale_document("inferway-backend", "inferway", 4, 4)),
        (200, scale_document("other-backend", "team-b", 2, 1)),
    ]
    statuses = scaler.status()
    assert [(r.method, r.url) for r in pool.requests] == [
        ("GET", f"{HOST}/apis/apps/v1/namespaces/inferway/deployments/inferway-backend/scale"),
        ("GET", f"{HOST}/apis/apps/v1/namespaces/team-b/deployments/other-backend/scale"),
    ]
    assert all(r.body is None for r in pool.requests)
    assert [(s.service, s.desired, s.ready) for s in statuses] == [("model", 4, 4), ("other", 2, 1)]


@pytest.mark.parametrize(
    ("code", "reason", "expected"),
    [
        (404, "NotFound", "deployment inferway/inferway-backend not found (cannot patch its "
         "scale)"),
        (403, "Forbidden", "not allowed to patch deployment inferway/inferway-backend/scale (403 "
         "Forbidden): grant the gateway's service account get and patch on deployments/scale"),
        (500, "InternalError", "patch deployment inferway/inferway-backend/scale: 500 Internal "
         "Server Error"),
    ],
)  # fmt: skip
def test_a_refusal_is_an_error_that_says_what_to_change(
    pool: FakePool, scaler: KubernetesScaler, code: int, reason: str, expected: str
) -> None:
    pool.answers.append((code, status_document(code, reason)))
    with pytest.raises(KubernetesScaleError) as caught:
        scaler.scale_to("model", 3, "test")
    assert str(caught.value).startswith(expected), str(caught.value)


def test_bad_input_never_reaches_the_api_server(pool: FakePool, scaler: KubernetesScaler) -> None:
    with pytest.raises(KubernetesScaleError, match="service 'nope' has no Kubernetes target"):
        scaler.scale_to("nope", 2, "test")
    with pytest.raises(ValueError, match="replicas must be >= 0"):
        scaler.scale_to("model", -1, "test")
    assert pool.requests == []
