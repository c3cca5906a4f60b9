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

import contextlib
import logging
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from inferway.gateway.actuators.replicas import ReplicaManager
from inferway.gateway.actuators.scale_actuators import KubernetesFactory
from inferway.gateway.admin import DEFAULT_ADMIN_PORT, AdminServer
from inferway.gateway.autoscale_policy import autoscale_configs
from inferway.gateway.autoscaling import AutoscaleDriver
from inferway.gateway.cert_watcher import CertificateSource, load_tls_secrets
from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.control_plane_metrics import ControlPlaneMetrics
from inferway.gateway.endpoints_follower import EndpointsFollower
from inferway.gateway.endpoints_watcher import EndpointsWatcher, load_initial_endpoints
from inferway.gateway.envoy_bootstrap import build_gateway_bootstrap
from inferway.gateway.features.server import FeatureRouterKeeper, start_feature_router
from inferway.gateway.keeper_state import KeeperView
from inferway.gateway.log_redaction import LogRedaction
from inferway.gateway.mask_sink import MaskSinkKeeper, start_mask_sink
from inferway.gateway.rollouts.driver import RolloutDriver
from inferway.gateway.rollouts.metrics import RolloutMetrics
from inferway.gateway.rollouts.sample_source import build_rollout_source
from inferway.gateway.rollouts.store import RolloutStore
from inferway.gateway.runtime_admin import AdminSettings, start_admin_and_replicas
from inferway.gateway.sources import StateSource
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
from inferway.xds.node_groups import node_group
from inferway.xds.policy_snapshot import build_policy_snapshot
from inferway.xds.resources import Resources
from inferway.xds.server import DEFAULT_MAX_CONNECTION_AGE_S, XdsServer, start_xds_server
from inferway.xds.snapshot import Snapshot
from inferway.xds.translate import translate as translate_ir

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


def plan_gateway(options: GatewayOptions) -> GatewayPlan:
    """Load -> sources -> resolve -> translate for ``options``, without sockets.

    Raises PolicyError with every located problem of the policy, its endpoints file, its
    certificate files, or the snapshot they translate to.
    """
    path = options.policy_path
    text = read_source_text(path)
    external_endpoints = options.endpoints_file is not None
    policy = load_policy_text(text, str(path), external_endpoints=external_endpoints)
    autoscale_configs(policy, text, str(path))  # located errors before any socket opens
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
    return GatewayPlan(str(path), text, policy, state, endpoints_path, endpoints_text, snapshot)


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
    _stack: contextlib.AsyncExitStack = field(repr=False)
    _endpoints: EndpointsWatcher | EndpointsFollower | None = field(default=None, repr=False)
    rollouts: RolloutDriver | None = None
    """The policy's canary rollouts (state in <workdir>/rollouts/)."""
    replicas: ReplicaManager | None = None
    """The replicas the gateway runs itself, following the live policy's ``replicas:``
    (idle while it has none)."""
    autoscale: AutoscaleDriver | None = None
    """The autoscaling loop over those replicas (with the replica manager or not at all)."""
    features: FeatureRouterKeeper | None = None
    """The feature router (running while the policy has routes with ``match.features``)."""
    mask_sink: MaskSinkKeeper | None = None
    """Masks Envoy's access log lines and spans (running while the policy has ``mask``)."""

    @property
    def endpoints_watcher(self) -> EndpointsWatcher | None:
        """The watcher of the endpoints file in use now (None: there is none)."""
        source = self._endpoints
        return source.watcher if isinstance(source, EndpointsFollower) else source

    async def stop(self) -> None:
        await self._stack.aclose()


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


def _keeper_view(options: GatewayOptions) -> KeeperView | None:
    """The keeper's Envoy, for the admin API of its control-plane process."""
    if options.keeper_state_file is None:
        return None
    return KeeperView(options.keeper_state_file, envoy_admin_port=options.envoy_admin_port)


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
    path = options.policy_path
    external_endpoints = options.endpoints_file is not None
    check_ports = (
        options.with_envoy
        if options.check_listener_ports is None
        else (options.check_listener_ports)
    )
    if check_ports:  # before Envoy starts: a taken port is a located error, not a NACK
        unbindable = listener_bind_issues(plan.policy, plan.policy_text, plan.source)
        if unbindable:
            raise PolicyError(unbindable)
    endpoints_path, endpoints_text = plan.endpoints_path, plan.endpoints_text
    cache = SnapshotCache(node_group=node_group)  # Envoys and proxyless gRPC clients
    plane = ControlPlane(cache, translate=options.translate or translate_ir)
    metrics = ControlPlaneMetrics.attach(plane)
    plane.add_observer(LogRedaction())  # before the first apply: it sets the names at start
    supervisor: EnvoySupervisor | None = None
    keeper = _keeper_view(options)

    def envoy_admin_port() -> int:  # the rollouts' metric source: ours, the keeper's, or given
        if supervisor is not None:
            return supervisor.admin_port
        return keeper.admin_port if keeper is not None else options.envoy_admin_port

    rollouts_dir = (
        options.workdir / "rollouts"
        if options.workdir is not None
        else Path(tempfile.mkdtemp(prefix="inferway-rollouts-"))
    )
    rollouts = RolloutDriver(
        plane,
        RolloutStore(rollouts_dir),
        lambda config: build_rollout_source(
            config,
            plane.policy,
            plane.state,
            envoy_admin_port,
            live=lambda: (plane.policy, plane.state),
        ),
    )
    RolloutMetrics.attach(metrics.registry, rollouts)
    plane.add_observer(rollouts)  # resumes saved rollouts with the first apply
    certificates = CertificateSource(path.parent, source=str(path))
    certificates.follow(plan.policy)
    sources: list[StateSource] = [certificates.resolve_state]  # TLS files load with each edit
    follower = EndpointsFollower(plane, path, endpoints_path, debounce_ms=options.debounce_ms)
    if not external_endpoints:
        sources.append(follower.resolve_state)  # endpoints_file moves with edits
        plane.add_observer(follower)
    sources.append(rollouts.resolve_state)  # a policy edit keeps the rollouts' weights
    # Saved rollouts' weights go into the first snapshot: Envoy never sees them reset.
    plane.apply_policy(
        plan.policy, str(path), state=rollouts.resolve_state(plan.policy, plan.state)
    )

    stack = contextlib.AsyncExitStack()
    replicas: ReplicaManager | None = None
    autoscale: AutoscaleDriver | None = None
    replicas_owned = True  # closed here on failure until the stack owns it
    if options.workdir is None:
        stack.callback(shutil.rmtree, rollouts_dir, True)
    try:
        xds = await start_xds_server(
            cache,
            options.host,
            options.xds_port,
            tls=xds_server_tls,
            tls_reload=reload,
            max_connection_age_s=options.xds_max_connection_age_s,
        )
        stack.push_async_callback(xds.stop, 0.5)
        features = await start_feature_router(plane, plan.policy)
        stack.push_async_callback(features.stop)
        mask_sink = await start_mask_sink(plane, plan.policy)  # before Envoy logs a line
        stack.push_async_callback(mask_sink.stop)

        watcher = PolicyWatcher(
            path,
            plane,
            debounce_ms=options.debounce_ms,
            external_endpoints=external_endpoints,
            sources=sources,
        )
        watcher.mark_loaded(plan.policy_text)
        await watcher.start()
        stack.push_async_callback(watcher.stop)
        await certificates.start(plane)
        stack.push_async_callback(certificates.stop)

        endpoints_source: EndpointsWatcher | EndpointsFollower = follower
        if external_endpoints:  # --endpoints-file: the command line decides, edits do not
            assert endpoints_path is not None
            endpoints_watcher = endpoints_source = EndpointsWatcher(
                endpoints_path, plane, debounce_ms=options.debounce_ms
            )
            endpoints_watcher.mark_loaded(endpoints_text)
            await endpoints_watcher.start()
            stack.push_async_callback(endpoints_watcher.stop)
        else:  # follow the policy's endpoints_file through edits
            stack.push_async_callback(follower.stop)
            await follower.start(endpoints_text)

        if options.with_envoy:
            workdir = options.workdir.absolute() if options.workdir is not None else None
            if workdir is None:
                workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="inferway-")))
            bootstrap = build_gateway_bootstrap(
                options, xds_port=xds.port, workdir=workdir, xds_client_tls=xds_client_tls
            )
            supervisor = EnvoySupervisor(
                bootstrap,
                workdir=workdir,
                log_level=options.envoy_log_level,
                concurrency=options.envoy_concurrency,
            )

        parts = await start_admin_and_replicas(
            AdminSettings(
                options.admin_address,
                options.admin_port,
                options.admin_token_file,
                options.workdir,
                options.kubernetes,
            ),
            stack,
            plane=plane,
            metrics=metrics,
            watcher=watcher,
            xds=xds,
            rollouts=rollouts,
            supervisor=supervisor,
            keeper=keeper,
            envoy_admin_port=envoy_admin_port,
            watchers=lambda: _watcher_health(watcher, endpoints_source, certificates),
        )
        admin, replicas, autoscale = parts.admin, parts.replicas, parts.autoscale

        if supervisor is not None:
            await supervisor.start()
            # Last in, first out: Envoy stops before everything else.
            stack.push_async_callback(supervisor.stop)
        await rollouts.start()  # after Envoy: the first scrape finds it
        stack.push_async_callback(rollouts.stop)
        # Before Envoy stops (LIFO): a replica drains while Envoy can still say so.
        stack.push_async_callback(replicas.close)
        replicas_owned = False
        await autoscale.start()
        stack.push_async_callback(autoscale.stop)
    except BaseException:
        if replicas_owned and replicas is not None:
            await replicas.close()
        await stack.aclose()
        raise
    return Gateway(
        options,
        cache,
        plane,
        xds,
        watcher,
        admin,
        supervisor,
        certificates,
        stack,
        _endpoints=endpoints_source,
        rollouts=rollouts,
        replicas=replicas,
        autoscale=autoscale,
        features=features,
        mask_sink=mask_sink,
    )
