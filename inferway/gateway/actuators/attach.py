"""Bind a replica manager to a ControlPlane: its ready replicas become ``State.replicas``,
and every policy the control plane applies reconfigures it.

The gateway's composition root calls :func:`attach_replica_manager` once; the manager
itself never sees the control plane, only the sink made here.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

from inferway.gateway.actuators.envoy_drain import EnvoyDrainProbe
from inferway.gateway.actuators.replica_set import DrainProbe
from inferway.gateway.actuators.replicas import ReplicaManager, ReplicaSink
from inferway.gateway.control_plane import (
    AppliedPolicy,
    ControlPlane,
    PolicyFollower,
    PolicyRefusedError,
)
from inferway.state.model import ServiceEndpoints
from inferway.xds.cache import node_in_sync

__all__ = ["ControlPlaneDrainProbe", "attach_replica_manager", "control_plane_sink"]

log = logging.getLogger(__name__)

SOURCE = "replica manager"


def control_plane_sink(control_plane: ControlPlane) -> ReplicaSink:
    """A sink that swaps ``State.replicas`` through ``ControlPlane.update_state``; a refusal
    is logged and the previous snapshot stays (the control plane records why)."""

    def sink(replicas: ServiceEndpoints) -> None:
        state = dataclasses.replace(control_plane.state, replicas=MappingProxyType(dict(replicas)))
        try:
            control_plane.update_state(state, SOURCE)
        except PolicyRefusedError as error:
            log.warning("replica endpoints refused: %s", error)

    return sink


class ControlPlaneDrainProbe:
    """Drained, as far as xDS can tell: the live State no longer holds the replica, every
    connected xDS client has ACKed its group's snapshot built from it, and (when given) the
    Envoy admin probe no longer lists the host. A refused update keeps the replica in State,
    so it is never drained and the manager's drain timeout applies."""

    def __init__(self, control_plane: ControlPlane, envoy: DrainProbe | None = None) -> None:
        self.control_plane = control_plane
        self.envoy = envoy

    async def __call__(self, service: str, host: str, port: int) -> bool:
        state = self.control_plane.state
        listed = state.replicas.get(service, ())
        if any(e.host == host and e.port == port for e in listed):
            return False
        cache = self.control_plane.cache
        for node in cache.node_status():  # Envoys and proxyless clients, each in its group
            if node.connected and not node_in_sync(node, cache.get_snapshot(node.group)):
                return False
        return True if self.envoy is None else await self.envoy(service, host, port)

    async def close(self) -> None:
        close = getattr(self.envoy, "close", None)
        if close is not None:
            await close()


class _FollowPolicy(PolicyFollower):
    """Control-plane observer: each applied policy reconfigures the manager."""

    def __init__(self, manager: ReplicaManager) -> None:
        self.manager = manager

    def on_applied(self, applied: AppliedPolicy, _changed: bool) -> None:
        self.manager.configure(applied.policy)


def attach_replica_manager(
    control_plane: ControlPlane,
    *,
    envoy_admin_urls: Sequence[str] = (),
    **options: Any,
) -> ReplicaManager:
    """A ReplicaManager writing into ``control_plane``'s State and following its policy.
    A removed replica is stopped once :class:`ControlPlaneDrainProbe` says so, asking the
    Envoys at ``envoy_admin_urls`` too when given. ``options`` go to
    :class:`ReplicaManager`. Call from the event loop; ``await manager.close()`` at
    shutdown."""
    if "drain_probe" not in options:
        envoy = EnvoyDrainProbe(envoy_admin_urls) if envoy_admin_urls else None
        options["drain_probe"] = ControlPlaneDrainProbe(control_plane, envoy)
    manager = ReplicaManager(control_plane_sink(control_plane), **options)
    control_plane.add_observer(_FollowPolicy(manager))
    if control_plane.policy is not None:
        manager.configure(control_plane.policy)
    return manager
