"""The gateway's admin API, assembled and started: its token, the core routes, the rollouts',
and the replica manager with its autoscaling loop (whose ``GET /autoscale``, profile routes
and ``inferway_autoscale_desired_replicas`` the admin app serves).

Split from the composition root (runtime.py) because the admin app is where these parts
meet: the replica manager must exist before the app's router freezes. It runs from here on,
but its place in the stop order comes later (before Envoy's, so a replica drains while Envoy
can still say so): it is held by the caller's components until the caller owns it.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferway.gateway.actuators.attach import attach_replica_manager
from inferway.gateway.actuators.replicas import ReplicaManager
from inferway.gateway.actuators.scale_actuators import KubernetesFactory
from inferway.gateway.admin import PICKERS_STATUS, AdminServer, build_admin_app, start_admin_server
from inferway.gateway.admin_security import (
    READS_NEED_TOKEN,
    build_reload,
    is_loopback,
    resolve_admin_token,
)
from inferway.gateway.autoscale_admin import add_autoscale_routes, register_autoscale_metrics
from inferway.gateway.autoscaling import AutoscaleDriver
from inferway.gateway.components import Components, Held
from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.control_plane_metrics import ControlPlaneMetrics
from inferway.gateway.fleet.fleet_admin import add_fleet_routes
from inferway.gateway.fleet.fleet_wiring import Fleet
from inferway.gateway.keeper_state import KeeperView
from inferway.gateway.loop_configs import compile_loops
from inferway.gateway.profile_admin import add_profile_routes
from inferway.gateway.rollouts.admin_routes import add_rollout_routes
from inferway.gateway.rollouts.driver import RolloutDriver
from inferway.gateway.supervisor import EnvoySupervisor
from inferway.gateway.watcher import PolicyWatcher
from inferway.xds.server import XdsServer

__all__ = ["AdminParts", "AdminSettings", "start_admin_and_replicas"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdminSettings:
    """The options of GatewayOptions the admin API and the replicas read."""

    address: str
    port: int
    token_file: Path | None
    workdir: Path | None
    kubernetes: KubernetesFactory | None


@dataclass(frozen=True)
class AdminParts:
    admin: AdminServer
    replicas: ReplicaManager
    replicas_stop: Held
    """The replica manager's close, held: the caller puts it in the stop order (``own``)."""
    autoscale: AutoscaleDriver
    """Not started: the caller starts it."""


async def start_admin_and_replicas(
    settings: AdminSettings,
    components: Components,
    *,
    plane: ControlPlane,
    metrics: ControlPlaneMetrics,
    watcher: PolicyWatcher,
    xds: XdsServer,
    rollouts: RolloutDriver,
    supervisor: EnvoySupervisor | None,
    keeper: KeeperView | None,
    envoy_admin_port: Callable[[], int | None],
    fleet: Fleet | None = None,
    watchers: Callable[[], list[dict[str, Any]]] | None = None,
    pickers_status: Callable[[], dict[str, Any]] | None = None,
) -> AdminParts:
    """Build the admin app with every route, start the replica manager and autoscaling loop
    (not yet running), then serve the app. The admin server's stop goes on ``components``."""
    token_dir = settings.workdir
    if token_dir is None:
        folder = tempfile.TemporaryDirectory(prefix="inferway-admin-")
        components.adopt("admin token's temporary folder", folder.cleanup)
        token_dir = Path(folder.name)
    token, token_source = resolve_admin_token(token_file=settings.token_file, workdir=token_dir)
    exposed = not is_loopback(settings.address)
    if exposed:
        log.warning(
            "admin API binds %s, not loopback: every request but GET /healthz and /metrics "
            "needs the admin token",
            settings.address,
        )
    admin_app = build_admin_app(
        plane,
        supervisor or keeper,
        metrics=metrics,
        token=token,
        reload=build_reload(watcher),
        xds_refusals=xds.refusals.recent,
        watchers=watchers,
    )
    admin_app[READS_NEED_TOKEN] = exposed
    add_rollout_routes(admin_app, rollouts)
    if fleet is not None:
        add_fleet_routes(admin_app, fleet)
    if pickers_status is not None:
        admin_app[PICKERS_STATUS] = pickers_status
    replicas, autoscale = start_replica_autoscaling(
        plane,
        workdir=settings.workdir,
        envoy_admin_urls=[f"http://127.0.0.1:{supervisor.admin_port}"] if supervisor else [],
        envoy_admin_port=envoy_admin_port,
        kubernetes=settings.kubernetes,
        gateway_metrics=metrics.render,
    )
    replicas_stop = components.hold("replica manager", replicas.close)
    add_profile_routes(admin_app, replicas.running_pids)
    add_autoscale_routes(admin_app, autoscale)  # 404 while nothing is autoscaled
    register_autoscale_metrics(metrics.registry, autoscale)
    admin = await start_admin_server(admin_app, host=settings.address, port=settings.port)
    components.adopt("admin API", admin.stop)
    if fleet is not None:
        fleet.advertise(admin.url)
    log.info("admin API on %s (GET /status, /policy, /healthz, /metrics)", admin.url)
    log.info("admin token for POST /reload: %s", token_source)
    return AdminParts(admin, replicas, replicas_stop, autoscale)


def start_replica_autoscaling(
    plane: ControlPlane,
    *,
    workdir: Path | None,
    envoy_admin_urls: list[str],
    envoy_admin_port: Callable[[], int | None],
    kubernetes: KubernetesFactory | None = None,
    gateway_metrics: Callable[[], bytes] | None = None,
) -> tuple[ReplicaManager, AutoscaleDriver]:
    """The replica manager and its autoscaling loop, both following the live policy: a
    service that gains ``replicas:`` (or ``autoscale:``) by a later edit is started and
    sized without a restart, one that loses it is drained and stopped. Idle (no process) while
    no service has ``replicas:``; ``kubernetes`` makes the client of a ``kubernetes`` target
    (None: from the pod's service account or the kubeconfig); ``gateway_metrics`` renders the
    gateway's own /metrics (token_rate reads the LLM token count there). A replica leaves only
    once the Envoys at ``envoy_admin_urls`` no longer list it; logs go to
    ``<workdir>/replicas``."""
    log_dir = workdir / "replicas" if workdir is not None else None
    manager = attach_replica_manager(plane, envoy_admin_urls=envoy_admin_urls, log_dir=log_dir)
    driver = AutoscaleDriver(
        manager, envoy_admin_port, kubernetes=kubernetes, gateway_metrics=gateway_metrics
    )
    if plane.policy is not None:  # compiled by plan_gateway already: the same policy
        driver.configure(compile_loops(plane.policy))
    plane.add_observer(driver)
    return manager, driver
