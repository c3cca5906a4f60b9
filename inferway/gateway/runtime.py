"""The composition root: one gateway from :class:`GatewayOptions`.

:func:`plan_gateway` is the part without sockets: read the policy, run its sources (the
endpoints file, the certificate files), resolve and translate into a consistent snapshot.
``inferway validate`` and ``render`` stop there; :func:`start_gateway` (``inferway run``,
``inferway demo`` and the test harnesses) starts from the same plan, so what ``validate``
accepts is what ``run`` accepts, and a policy that cannot be applied stops the start before
any socket is opened or Envoy is started. Then, in this order: xDS server, policy watcher,
certificate and endpoints watchers, admin API, supervised Envoy. Shutdown runs in reverse and
stops Envoy first: a data plane is never left without the process that supervises it.
"""

from __future__ import annotations

import logging
import shutil
import socket
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from inferway.gateway.actuators.replicas import ReplicaManager
from inferway.gateway.actuators.scale_actuators import KubernetesFactory
from inferway.gateway.admin import DEFAULT_ADMIN_PORT, AdminServer
from inferway.gateway.autoscale_fleet import AutoscaleFleet
from inferway.gateway.autoscaling import AutoscaleDriver
from inferway.gateway.cert_watcher import CertificateSource, load_tls_secrets
from inferway.gateway.components import Calls, Components
from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.endpoints_follower import EndpointsFollower
from inferway.gateway.endpoints_watcher import EndpointsWatcher, load_initial_endpoints
from inferway.gateway.features.server import FeatureRouterKeeper
from inferway.gateway.fleet.envoy_reports import EnvoyReports
from inferway.gateway.fleet.fleet_limits import FleetLimits
from inferway.gateway.fleet.fleet_load import FleetLoadSource
from inferway.gateway.fleet.fleet_policy import fleet_policy_issues
from inferway.gateway.fleet.fleet_wiring import Fleet, open_fleet
from inferway.gateway.llm.server import LlmKeeper
from inferway.gateway.loop_configs import LoopConfigs, compile_loops
from inferway.gateway.mask_sink import MaskSinkKeeper
from inferway.gateway.picker.keeper import PickerKeeper
from inferway.gateway.rollouts.driver import RolloutDriver
from inferway.gateway.runtime_admin import AdminSettings, start_admin_and_replicas
from inferway.gateway.runtime_wiring import envoy_supervisor, start_endpoints, wire_control_plane
from inferway.gateway.supervisor import EnvoySupervisor
from inferway.gateway.watcher import PolicyWatcher
from inferway.gateway.xds_mtls import XdsMtlsFiles, XdsServerTlsReloader, load_xds_mtls
from inferway.policies import load_policy_text
from inferway.policies.checks_bind import listener_bind_issues
from inferway.policies.endpoints import endpoints_file_path
from inferway.policies.errors import PolicyError, read_source_text
from inferway.policies.located import place_issues
from inferway.policies.model import Policy
from inferway.resolve import IR
from inferway.state import State
from inferway.xds.cache import SnapshotCache
from inferway.xds.policy_snapshot import build_policy_snapshot
from inferway.xds.resources import Resources
from inferway.xds.server import DEFAULT_MAX_CONNECTION_AGE_S, XdsServer, start_xds_server
from inferway.xds.snapshot import Snapshot

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

DEFAULT_XDS_PORT = 18000
DEFAULT_ENVOY_ADMIN_PORT = 15001


@dataclass(frozen=True)
class GatewayOptions:
    """Everything ``inferway run`` can be told; every address is loopback by default."""

    policy_path: Path
    host: str = "127.0.0.1"
    xds_port: int = DEFAULT_XDS_PORT
    admin_port: int = DEFAULT_ADMIN_PORT
    envoy_admin_port: int = DEFAULT_ENVOY_ADMIN_PORT
    node_id: str = "inferway"
    node_cluster: str = "inferway"
    zone: str = ""
    """The supervised Envoy's zone (``node.locality.zone``; ``--zone``)."""
    region: str = ""
    """The supervised Envoy's region (``node.locality.region``; ``--region``)."""
    stats_push_s: float | None = 2.0
    """Every Envoy of this control plane pushes its stats here this often (OTLP on the xDS
    connection's cluster), so the loops can read the fleet's evidence; None: never."""
    store: str = ""
    """The fleet's store (``--store``: ``file:PATH``, ``etcd://...`` or ``kubernetes://NS``).
    Empty: one node, the loops' state in the workdir, as always. With a store, the loops run
    on the elected replica only, from the fleet's shared state and every Envoy's evidence."""
    replica_id: str = ""
    """This control-plane replica's name in the election (empty: host name and xDS port)."""
    lease_ttl_s: float = 5.0
    """The leader's lease: another replica takes over within this long after it dies."""
    with_envoy: bool = True
    workdir: Path | None = None
    envoy_log_level: str = "warning"
    envoy_concurrency: int | None = None
    debounce_ms: int = 10
    admin_address: str = "127.0.0.1"
    """Where the admin API binds; anything but loopback is logged as a warning."""
    admin_token_file: Path | None = None
    """Token for state-changing admin requests (else $INFERWAY_ADMIN_TOKEN, else generated
    into <workdir>/admin-token, mode 0600)."""
    envoy_runtime: Mapping[str, Any] | None = None
    """Envoy runtime keys for the bootstrap (e.g. tracing's FAST_FLUSH_RUNTIME)."""
    xds_protocol: Literal["sotw", "delta"] = "sotw"
    """How the supervised Envoy speaks ADS: state-of-the-world or incremental (delta)."""
    endpoints_file: Path | None = None
    """Overrides the policy's ``endpoints_file``: services' endpoints from a watched file."""
    xds_mtls: XdsMtlsFiles | None = None
    """Mutual TLS between Envoy and the xDS server (``--xds-mtls-dir`` and friends)."""
    xds_max_connection_age_s: float | None = DEFAULT_MAX_CONNECTION_AGE_S
    """Envoys reconnect this often, so rotated xDS certificates reach every connection."""
    translate: Callable[[IR], Resources] | None = None
    """The translator pushes go through (None: the real one). Tests inject one that produces a
    config Envoy rejects, to exercise the NACK path with a real Envoy."""

    check_listener_ports: bool | None = None
    """Refuse a listener port that cannot be bound, as a located error, before Envoy starts
    (None: when this gateway starts Envoy; the keeper asks its control plane on first start)."""
    keeper_state_file: Path | None = None
    """Set by the keeper (gateway/keeper.py) for its control-plane process (which runs Envoy);
    the admin API reads Envoy's state from this file."""
    kubernetes: KubernetesFactory | None = None
    """Makes the client of a ``scale_target: {kubernetes: ...}`` service (None: the pod's
    service account, else the kubeconfig). Tests pass one built on a recorded HTTP pool."""


@dataclass(frozen=True)
class GatewayPlan:
    """What a gateway would serve, read and checked, before any socket is opened."""

    source: str
    """The policy file, as named in errors and in ``inferway status``."""
    policy_text: str
    policy: Policy
    state: State
    """The policy's runtime sources as read now: endpoints file and certificate files."""
    endpoints_path: Path | None
    endpoints_text: str
    snapshot: Snapshot
    loops: LoopConfigs
    """The rollouts' and autoscalers' configs, compiled once; the drivers take them."""


def plan_gateway(options: GatewayOptions) -> GatewayPlan:
    """Load -> sources -> resolve -> translate for ``options``, without sockets.

    Raises PolicyError with every located problem of the policy, its endpoints file, its
    certificate files, or the snapshot they translate to.
    """
    path = options.policy_path
    text = read_source_text(path)
    external_endpoints = options.endpoints_file is not None
    policy = load_policy_text(text, str(path), external_endpoints=external_endpoints)
    loops = compile_loops(policy)  # validated by the loader: compiling cannot fail
    endpoints_path = options.endpoints_file or endpoints_file_path(policy, path)
    state = State()
    endpoints_text = ""
    if endpoints_path is not None:
        endpoints_text, endpoints = load_initial_endpoints(
            endpoints_path, [service.name for service in policy.services]
        )
        state = State(endpoints=endpoints)
    try:
        secrets = load_tls_secrets(policy, path.parent, source=str(path))
    except PolicyError as error:  # located on the TLS settings naming the files
        raise PolicyError(place_issues(text, str(path), error.issues)) from None
    state = State(endpoints=state.endpoints, secrets=secrets)
    snapshot = build_policy_snapshot(policy, state, str(path))
    return GatewayPlan(
        str(path), text, policy, state, endpoints_path, endpoints_text, snapshot, loops
    )


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
