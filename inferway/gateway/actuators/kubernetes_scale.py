"""Sizing a Kubernetes Deployment through its ``scale`` subresource, with the official
``kubernetes`` client: the edge where an autoscaling decision becomes
``PATCH /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale``.

It has the replica manager's two verbs, ``status()`` (desired = the Scale's spec.replicas,
ready = its status.replicas) and ``scale_to(service, replicas, reason)``, so a decision loop
can drive either. The patch is a JSON merge patch of ``spec.replicas`` only: it never touches
the Deployment's template, and a concurrent rollout keeps going. The gateway's service
account needs ``get`` and ``patch`` on ``deployments/scale`` (docs/kubernetes.md has the
Role). Blocking (the client is synchronous): call it from a thread in an event loop.

No API server runs where inferway is tested: tests/unit/test_kubernetes_scale.py checks the
requests the client really sends (method, path, content type, body) and how answers and
refusals are read, below the client at its HTTP pool.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

__all__ = ["KubernetesScaleError", "KubernetesScaler", "ScaleStatus", "ScaleTarget"]

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class ScaleTarget:
    """The Deployment that serves one service."""

    deployment: str
    namespace: str


@dataclass(frozen=True)
class ScaleStatus:
    service: str
    desired: int
    ready: int


class KubernetesScaleError(Exception):
    """The API server refused or could not be reached; the message says what to change."""


def _explain(error: ApiException, target: ScaleTarget, verb: str) -> KubernetesScaleError:
    where = f"deployment {target.namespace}/{target.deployment}"
    if error.status == 404:
        return KubernetesScaleError(f"{where} not found (cannot {verb} its scale)")
    if error.status in (401, 403):
        return KubernetesScaleError(
            f"not allowed to {verb} {where}/scale ({error.status} {error.reason}): grant the "
            "gateway's service account get and patch on deployments/scale in that namespace"
        )
    return KubernetesScaleError(f"{verb} {where}/scale: {error.status} {error.reason}")


class KubernetesScaler:
    def __init__(
        self,
        api: k8s.AppsV1Api,
        targets: Mapping[str, ScaleTarget],
        *,
        timeout_s: float = 10.0,
    ) -> None:
        self._api = api
        self._targets = dict(targets)
        self._timeout = timeout_s

    @classmethod
    def from_environment(cls, targets: Mapping[str, ScaleTarget]) -> KubernetesScaler:
        """In a pod, its service account (in-cluster config); elsewhere ``$KUBECONFIG`` or
        ``~/.kube/config``, as kubectl does."""
        configuration = k8s.Configuration()
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
        except k8s_config.ConfigException:
            k8s_config.load_kube_config(client_configuration=configuration)
        return cls(k8s.AppsV1Api(k8s.ApiClient(configuration)), targets)

    def _target(self, service: str) -> ScaleTarget:
        try:
            return self._targets[service]
        except KeyError:
            raise KubernetesScaleError(f"service '{service}' has no Kubernetes target") from None

    def read(self, service: str) -> ScaleStatus:
        target = self._target(service)
        try:
            scale = self._api.read_namespaced_deployment_scale(
                target.deployment, target.namespace, _request_timeout=self._timeout
            )
        except ApiException as error:
            raise _explain(error, target, "read") from None
        spec_replicas = scale.spec.replicas if scale.spec is not None else None
        ready = scale.status.replicas if scale.status is not None else 0
        return ScaleStatus(service, int(spec_replicas or 0), int(ready or 0))

    def status(self) -> list[ScaleStatus]:
        return [self.read(service) for service in sorted(self._targets)]

    def scale_to(self, service: str, replicas: int, reason: str) -> ScaleStatus:
        """Set the Deployment's replicas; the answer is the Scale the API server stored."""
        if replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {replicas}")
        target = self._target(service)
        try:
            scale = self._api.patch_namespaced_deployment_scale(
                target.deployment,
                target.namespace,
                {"spec": {"replicas": replicas}},
                _content_type=MERGE_PATCH,
                _request_timeout=self._timeout,
            )
        except ApiException as error:
            raise _explain(error, target, "patch") from None
        log.info(
            "scaled deployment %s/%s to %d replicas: %s",
            target.namespace,
            target.deployment,
            replicas,
            reason,
        )
        stored = scale.spec.replicas if scale.spec is not None else None
        ready = scale.status.replicas if scale.status is not None else 0
        return ScaleStatus(service, int(stored or 0), int(ready or 0))
