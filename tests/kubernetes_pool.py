"""The official kubernetes client with its urllib3 pool replaced by one Deployment's Scale.

No API server can run here, so tests drive the real client (serialization, content types,
ApiException) down to its HTTP pool, and this pool answers as the API server's
``deployments/{name}/scale`` subresource does: GET returns the Scale, a merge PATCH sets its
``spec.replicas`` and returns it. Every request is recorded (method, URL, headers, body), and
``refuse`` answers the next PATCHes with an API status (403, 404, ...) instead.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

import urllib3
from kubernetes import client as k8s

from inferway.gateway.actuators.kubernetes_scale import KubernetesScaler, ScaleTarget

__all__ = ["HOST", "Recorded", "ScalePool", "scaler_on"]

HOST = "https://kubernetes.default.svc"
_REASONS = {200: "OK", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 500: "Error"}


@dataclass
class Recorded:
    method: str
    url: str
    headers: dict[str, str]
    body: Any


@dataclass
class ScalePool:
    """One Deployment's Scale behind urllib3.PoolManager's ``request`` (thread-safe: the
    gateway calls the blocking client from worker threads)."""

    name: str
    namespace: str
    spec: int
    ready: int
    refuse: list[int] = field(default_factory=list)
    requests: list[Recorded] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def path(self) -> str:
        return f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{self.name}/scale"

    def patches(self) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.method == "PATCH"]

    def request(self, method: str, url: str, **kwargs: Any) -> urllib3.HTTPResponse:
        body = kwargs.get("body")
        with self._lock:
            self.requests.append(
                Recorded(method, url, dict(kwargs.get("headers") or {}), body and json.loads(body))
            )
            if url != HOST + self.path:
                return _answer(404, _status(404, "NotFound"))
            if method == "PATCH":
                if self.refuse:
                    code = self.refuse.pop(0)
                    return _answer(code, _status(code, _REASONS[code]))
                self.spec = int(json.loads(body)["spec"]["replicas"])
            return _answer(200, self.document())

    def document(self) -> dict[str, Any]:
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {"replicas": self.spec},
            "status": {"replicas": self.ready, "selector": "app=backend"},
        }


def _status(code: int, reason: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason,
            "code": code}  # fmt: skip


def _answer(status: int, document: dict[str, Any]) -> urllib3.HTTPResponse:
    return urllib3.HTTPResponse(
        body=json.dumps(document).encode(),
        status=status,
        reason=_REASONS[status],
        headers={"Content-Type": "application/json"},
        preload_content=False,
    )


def scaler_on(pool: ScalePool, service: str, target: ScaleTarget) -> KubernetesScaler:
    """A KubernetesScaler for ``service`` whose client talks to ``pool``."""
    api_client = k8s.ApiClient(k8s.Configuration(host=HOST))
    api_client.rest_client.pool_manager = pool
    return KubernetesScaler(k8s.AppsV1Api(api_client), {service: target})
