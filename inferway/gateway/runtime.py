"""The composition root: one gateway from :class:`GatewayOptions`.

:func:`plan_gateway` (gateway_plan.py) is the part without sockets: read the policy, run its
sources (the endpoints file, the certificate files), resolve and translate into a consistent
snapshot. ``inferway validate`` and ``render`` stop there; :func:`start_gateway` (``inferway
run``, ``inferway demo`` and the test harnesses) starts from the same plan, so what
``validate`` accepts is what ``run`` accepts, and a policy that cannot be applied stops the
start before any socket is opened or Envoy is started. Then, in this order: xDS server,
policy watcher, certificate and endpoints watchers, admin API, supervised Envoy. Shutdown
runs in reverse and stops Envoy first: a data plane is never left without the process that
supervises it."""

from __future__ import annotations

import logging
import shutil
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferway.gateway.actuators.replicas import ReplicaManager
from inferway.gateway.admin import AdminServer
from inferway.gateway.autoscale_fleet import AutoscaleFleet
from inferway.gateway.autoscaling import AutoscaleDriver
from inferway.gateway.cert_watcher import CertificateSource
from inferway.gateway.components import Calls, Components
from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.endpoints_follower import EndpointsFollower
from inferway.gateway.endpoints_watcher import EndpointsWatcher
from inferway.gateway.features.server import FeatureRouterKeeper
from inferway.gateway.fleet.envoy_reports import EnvoyReports
from inferway.gateway.fleet.fleet_limits import FleetLimits
from inferway.gateway.fleet.fleet_load import FleetLoadSource
from inferway.gateway.fleet.fleet_policy import fleet_policy_issues
from inferway.gateway.fleet.fleet_wiring import Fleet, open_fleet
from inferway.gateway.gateway_plan import (
    DEFAULT_ENVOY_ADMIN_PORT,
    DEFAULT_XDS_PORT,
    GatewayOptions,
    GatewayPlan,
    plan_gateway,
)
from inferway.gateway.llm.server import LlmKeeper
from inferway.gateway.mask_sink import MaskSinkKeeper
from inferway.gateway.picker.keeper import PickerKeeper
from inferway.gateway.rollouts.driver import RolloutDriver
from inferway.gateway.runtime_admin import AdminSettings, start_admin_and_replicas
from inferway.gateway.runtime_wiring import envoy_supervisor, start_endpoints, wire_control_plane
from inferway.gateway.supervisor import EnvoySupervisor
from inferway.gateway.watcher import PolicyWatcher
from inferway.gateway.xds_mtls import XdsServerTlsReloader, load_xds_mtls
from inferway.policies.checks_bind import listener_bind_issues
from inferway.policies.errors import PolicyError
from inferway.xds.cache import SnapshotCache
from inferway.xds.server import XdsServer, start_xds_server

__all__ = [
    "DEFAULT_ENVOY_ADMIN_PORT",
    "DEFAULT_XDS_PORT",
    "Gateway",
    "GatewayOptions",
    "GatewayPlan",
    "plan_gateway",
    "start_gateway",
]

log = logging.getLogger(__name__)


@dataclass
class Gateway:
    options: GatewayOptions
    cache: SnapshotCache
    control_plane: ControlPlane
    xds: XdsServer
    watcher: PolicyWatcher
    admin: AdminServer
    supervisor: EnvoySupervisor | None
    certificates: CertificateSource
    """Watches the certificate files the live policy names (``rotations`` counts pushes)."""
    _components: Components = field(repr=False)
    _endpoints: EndpointsWatcher | EndpointsFollower | None = field(default=None, repr=False)
    rollouts: RolloutDriver | None = None
    """The policy's canary rollouts (state in <workdir>/rollouts/)."""
    replicas: ReplicaManager | None = None
    """The replicas the gateway runs itself, following the live policy's ``replicas:``
    (idle while it has none)."""
    autoscale: AutoscaleDriver | None = None
    """The autoscaling loop over those replicas (with the replica manager or not at all)."""
    fleet: Fleet | None = None
    """This replica's part of a fleet (None: one node)."""
    envoy_reports: EnvoyReports | None = None
    """The stats every Envoy pushes (node, zone, latest totals per cluster)."""
    features: FeatureRouterKeeper | None = None
    """The feature router (running while the policy has routes with ``match.features``)."""
    llm: LlmKeeper | None = None
    """The LLM processor (running while the policy has ``openai`` routes)."""
    mask_sink: MaskSinkKeeper | None = None
    """Masks Envoy's access log lines and spans (running while the policy has ``mask``)."""
    pickers: PickerKeeper | None = None
    """Endpoint pickers (running while services have ``picker:`` without ``external``)."""

    @property
    def endpoints_watcher(self) -> EndpointsWatcher | None:
        """The watcher of the endpoints file in use now (None: there is none)."""
        source = self._endpoints
        return source.watcher if isinstance(source, EndpointsFollower) else source

    async def stop(self) -> None:
        """Stop every part in reverse start order: Envoy's loops, then Envoy, then the rest."""
        await self._components.stop()


def _watcher_health(
    policy: PolicyWatcher,
    endpoints: EndpointsWatcher | EndpointsFollower,
    certificates: CertificateSource,
) -> list[dict[str, Any]]:
    """``GET /status``'s ``watchers``: the policy's, the endpoints file's in use now (if
    any), the certificate files'."""
    current = endpoints.watcher if isinstance(endpoints, EndpointsFollower) else endpoints
    found = [policy.health] + ([current.health] if current is not None else [])
    return [health.document() for health in (*found, certificates.health)]


async def start_gateway(options: GatewayOptions) -> Gateway:
    """Start everything, or nothing: a failure part-way stops what had started, then raises.

    Raises PolicyError / PolicyRefusedError when the policy file cannot be applied, and
    XdsMtlsError when the xDS mutual-TLS files cannot be used.
    """
    # Stamped before the first read, so a rotation racing the start is still picked up.
    reload = XdsServerTlsReloader(options.xds_mtls) if options.xds_mtls is not None else None
    xds_server_tls, xds_client_tls = (
        load_xds_mtls(options.xds_mtls, node_id=options.node_id, with_envoy=options.with_envoy)
        if options.xds_mtls is not None
        else (None, None)
    )
    plan = plan_gateway(options)
    reports = EnvoyReports(verify_identity=xds_server_tls is not None)
    check_ports = (
        options.with_envoy if options.check_listener_ports is None else options.check_listener_ports
    )
    if check_ports:  # before Envoy starts: a taken port is a located error, not a NACK
        unbindable = listener_bind_issues(plan.policy, plan.policy_text, plan.source)
        if unbindable:
            raise PolicyError(unbindable)
    if options.store:  # a fleet shares decisions, not local processes
        unshareable = fleet_policy_issues(plan.policy, plan.source)
        if unshareable:
            raise PolicyError(unshareable)
    fleet = await _open_fleet(options, reports)
    wiring = wire_control_plane(
        options,
        plan,
        rollout_store=fleet.rollouts if fleet is not None else None,
        fleet_windows=fleet.windows if fleet is not None else None,
    )
    plane, rollouts = wiring.plane, wiring.rollouts
    if fleet is not None:
        plane.policy_gate = fleet_policy_issues

    components = Components()
    if options.workdir is None:
        components.adopt("rollouts folder", lambda: shutil.rmtree(wiring.rollouts_dir, True))
    try:
        xds = await start_xds_server(
            wiring.cache,
            options.host,
            options.xds_port,
            tls=xds_server_tls,
            tls_reload=reload,
            max_connection_age_s=options.xds_max_connection_age_s,
            services=[reports.register],
            refusals=reports.refusals,
        )
        components.adopt("xDS server", lambda: xds.stop(0.5))
        if fleet is not None:
            fleet.rollouts.on_change = rollouts.adopt
            await components.start("fleet", fleet)
        features = await components.start("feature router", FeatureRouterKeeper(plane, plan.policy))
        llm = await components.start(
            "LLM processor", LlmKeeper(plane, plan.policy, wiring.metrics.registry)
        )
        pickers = await components.start("endpoint picker", PickerKeeper(plane, plan.policy))
        mask_sink = await components.start(  # before Envoy logs a line
            "mask sink", MaskSinkKeeper(plane, plan.policy)
        )
        watcher = PolicyWatcher(
            options.policy_path,
            plane,
            debounce_ms=options.debounce_ms,
            external_endpoints=options.endpoints_file is not None,
            sources=wiring.sources,
        )
        watcher.mark_loaded(plan.policy_text)
        await components.start("policy watcher", watcher)
        certificates = wiring.certificates
        await components.start(
            "certificate watcher", Calls(lambda: certificates.start(plane), certificates.stop)
        )
        endpoints = await start_endpoints(components, options, plan, wiring)
        supervisor = envoy_supervisor(components, options, xds.port, xds_client_tls)
        wiring.envoy_admin_port.supervisor = supervisor
        parts = await start_admin_and_replicas(
            AdminSettings(
                options.admin_address,
                options.admin_port,
                options.admin_token_file,
                options.workdir,
                options.kubernetes,
            ),
            components,
            plane=plane,
            metrics=wiring.metrics,
            watcher=watcher,
            xds=xds,
            rollouts=rollouts,
            supervisor=supervisor,
            keeper=wiring.envoy_admin_port.keeper,
            envoy_admin_port=wiring.envoy_admin_port,
            fleet=fleet,
            watchers=lambda: _watcher_health(watcher, endpoints, certificates),
            pickers_status=pickers.status,
        )
        if supervisor is not None:  # stops before everything started earlier
            await components.start("Envoy", supervisor)
        if fleet is None:
            await components.start("rollouts", rollouts)  # after Envoy: the first scrape finds it
        components.own(parts.replicas_stop)  # before Envoy stops: a replica drains while it can
        if fleet is None:
            await components.start("autoscaling", parts.autoscale)
        else:  # the loops run on the elected replica only, on every Envoy's evidence
            parts.autoscale.use_fleet(
                AutoscaleFleet(
                    FleetLoadSource(fleet.newest_reports(), silent_after_s=fleet.silent_after_s),
                    fleet.autoscale,
                    fleet.fence,
                )
            )
            limits = FleetLimits(
                plane,
                fleet.store,
                fleet.newest_reports(),
                fleet.fence,
                silent_after_s=fleet.silent_after_s,
            )
            fleet.limits = limits
            await components.start("fleet rate limits", limits)
            work = fleet.lead(
                [
                    ("rollouts", rollouts),
                    ("autoscaling", parts.autoscale),
                    ("rate limits", limits.splitter),
                ]
            )
            limits.fenced = work.lose
            await components.start("leader work", work)
    except BaseException:
        await components.stop()
        raise
    return Gateway(
        options,
        wiring.cache,
        plane,
        xds,
        watcher,
        parts.admin,
        supervisor,
        certificates,
        components,
        _endpoints=endpoints,
        rollouts=rollouts,
        replicas=parts.replicas,
        autoscale=parts.autoscale,
        envoy_reports=reports,
        fleet=fleet,
        features=features,
        pickers=pickers,
        mask_sink=mask_sink,
        llm=llm,
    )


async def _open_fleet(options: GatewayOptions, reports: EnvoyReports) -> Fleet | None:
    if not options.store:
        return None
    workdir = options.workdir or Path(tempfile.gettempdir())
    identity = options.replica_id or f"{socket.gethostname()}:{options.xds_port}"
    return await open_fleet(
        options.store,
        workdir=workdir,
        identity=identity,
        ttl_s=options.lease_ttl_s,
        reports=reports,
        push_s=options.stats_push_s or 2.0,
    )
