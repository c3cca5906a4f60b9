"""What an autoscaling decision acts on, per service: one small protocol, three edges.

The autoscaling loop (gateway/autoscaling.py) asks a service's actuator for the counts the
Autoscaler decides from (``counts``) and hands it the decision (``scale_to``); which actuator
is the policy's ``autoscale.scale_target`` (policies/scale_target.py):

- ``replicas``: the gateway's own :class:`ReplicaManager` (its desired and ready counts).
- ``metric``: nothing is actuated here; the decision is published as
  ``inferway_autoscale_desired_replicas`` and KEDA or an HPA sizes the Deployment. The count
  decided from is what the gateway sees: the hosts Envoy holds healthy in that cluster
  (``cluster.<name>.membership_healthy``; behind a headless Service resolved STRICT_DNS, each
  ready pod is one host).
- ``kubernetes``: the Deployment's ``scale`` subresource through :class:`KubernetesScaler`
  (its spec.replicas and status.replicas), the blocking client run in a thread. The client
  is made on first use, so a gateway without the ``kubernetes`` extra or without cluster
  credentials shows why in the service's status instead of failing to start.

Every failure is a :class:`ScaleActuatorError` whose message the loop shows and logs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from inferway.gateway.actuators.replicas import ReplicaManager, UnknownServiceError
from inferway.policies.scale_target import ScaleTargetSpec

if TYPE_CHECKING:
    from inferway.gateway.actuators.kubernetes_scale import KubernetesScaler, ScaleTarget

__all__ = [
    "Counts",
    "KubernetesActuator",
    "KubernetesFactory",
    "MetricActuator",
    "ReplicaActuator",
    "ScaleActuator",
    "ScaleActuatorError",
    "scaler_from_environment",
    "select_actuator",
]


class ScaleActuatorError(Exception):
    """The counts could not be read or the decision could not be applied; says why."""


@dataclass(frozen=True)
class Counts:
    """What the Autoscaler decides from: the count asked for now and the count serving."""

    current: int
    ready: int


class ScaleActuator(Protocol):
    def describe(self) -> dict[str, Any]:
        """The target as shown in ``GET /autoscale`` (``kind`` and where)."""
        ...

    async def counts(self, service: str, envoy_healthy: int | None) -> Counts:
        """``envoy_healthy``: the cluster's healthy hosts in Envoy (None: not listed)."""
        ...

    async def scale_to(self, service: str, replicas: int, reason: str) -> None: ...


class ReplicaActuator:
    def __init__(self, manager: ReplicaManager) -> None:
        self.manager = manager

    def describe(self) -> dict[str, Any]:
        return {"kind": "replicas"}

    async def counts(self, service: str, envoy_healthy: int | None) -> Counts:
        status = {s.service: s for s in self.manager.status()}.get(service)
        if status is None:
            raise ScaleActuatorError(f"the replica manager runs no replicas of '{service}'")
        return Counts(status.desired, status.ready)

    async def scale_to(self, service: str, replicas: int, reason: str) -> None:
        try:
            self.manager.scale_to(service, replicas, reason)
        except UnknownServiceError as error:
            raise ScaleActuatorError(str(error)) from None


class MetricActuator:
    """Publish only: the decision is the metric, so ``scale_to`` has nothing to do."""

    def describe(self) -> dict[str, Any]:
        return {"kind": "metric"}

    async def counts(self, service: str, envoy_healthy: int | None) -> Counts:
        if envoy_healthy is None:
            raise ScaleActuatorError(
                f"Envoy lists no membership of cluster '{service}' yet (no snapshot applied?)"
            )
        return Counts(envoy_healthy, envoy_healthy)

    async def scale_to(self, service: str, replicas: int, reason: str) -> None:
        return None


KubernetesFactory = Callable[[str, "ScaleTarget"], "KubernetesScaler"]
"""(service, its Deployment) -> a scaler for it; tests pass one built on a recorded pool."""


def scaler_from_environment(service: str, target: ScaleTarget) -> KubernetesScaler:
    """The in-cluster service account, else the kubeconfig (as kubectl finds it)."""
    from inferway.gateway.actuators.kubernetes_scale import KubernetesScaler

    return KubernetesScaler.from_environment({service: target})


class KubernetesActuator:
    def __init__(
        self, service: str, deployment: str, namespace: str, factory: KubernetesFactory | None
    ) -> None:
        self.service = service
        self.deployment = deployment
        self.namespace = namespace
        self._factory = factory or scaler_from_environment
        self._scaler: KubernetesScaler | None = None

    def describe(self) -> dict[str, Any]:
        return {"kind": "kubernetes", "deployment": self.deployment, "namespace": self.namespace}

    def _client(self) -> KubernetesScaler:
        if self._scaler is None:
            try:
                from inferway.gateway.actuators.kubernetes_scale import ScaleTarget
            except ImportError as exc:
                raise ScaleActuatorError(
                    f"the kubernetes client is not installed ({exc}): pip install "
                    "'inferway[kubernetes]'"
                ) from None
            try:
                self._scaler = self._factory(
                    self.service, ScaleTarget(self.deployment, self.namespace)
                )
            except Exception as exc:  # the client's config errors have no common base
                raise ScaleActuatorError(
                    f"no Kubernetes client configuration (in-cluster or kubeconfig): {exc}"
                ) from None
        return self._scaler

    async def counts(self, service: str, envoy_healthy: int | None) -> Counts:
        from inferway.gateway.actuators.kubernetes_scale import KubernetesScaleError

        scaler = self._client()
        try:
            status = await asyncio.to_thread(scaler.read, service)
        except KubernetesScaleError as error:
            raise ScaleActuatorError(str(error)) from None
        except Exception as exc:  # urllib3's connection errors, a TLS failure: shown, not raised
            raise ScaleActuatorError(_unreachable(exc)) from None
        return Counts(status.desired, status.ready)

    async def scale_to(self, service: str, replicas: int, reason: str) -> None:
        from inferway.gateway.actuators.kubernetes_scale import KubernetesScaleError

        scaler = self._client()
        try:
            await asyncio.to_thread(scaler.scale_to, service, replicas, reason)
        except KubernetesScaleError as error:
            raise ScaleActuatorError(str(error)) from None
        except Exception as exc:  # urllib3's connection errors, a TLS failure: shown, not raised
            raise ScaleActuatorError(_unreachable(exc)) from None


def _unreachable(exc: Exception) -> str:
    return f"Kubernetes API unreachable: {type(exc).__name__}: {exc}"


def select_actuator(
    service: str,
    spec: ScaleTargetSpec,
    manager: ReplicaManager,
    kubernetes: KubernetesFactory | None = None,
) -> ScaleActuator:
    """The actuator for ``service``'s scale target."""
    if spec.kind == "metric":
        return MetricActuator()
    if spec.kind == "kubernetes":
        assert spec.deployment is not None and spec.namespace is not None
        return KubernetesActuator(service, spec.deployment, spec.namespace, kubernetes)
    return ReplicaActuator(manager)
