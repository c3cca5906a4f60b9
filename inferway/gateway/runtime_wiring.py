"""The wiring ``start_gateway`` (runtime.py) starts from: the control plane with its
observers and state sources, the endpoints source, Envoy's supervisor. Each piece is built
here and handed back; runtime.py keeps the order in which they start and stop.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from inferway.gateway.cert_watcher import CertificateSource
from inferway.gateway.components import Components
from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.control_plane_metrics import ControlPlaneMetrics
from inferway.gateway.endpoints_follower import EndpointsFollower
from inferway.gateway.endpoints_watcher import EndpointsWatcher
from inferway.gateway.envoy_bootstrap import BootstrapOptions, build_gateway_bootstrap
from inferway.gateway.envoy_modules import provide_envoy_modules
from inferway.gateway.keeper_state import KeeperView
from inferway.gateway.log_redaction import LogRedaction
from inferway.gateway.rollouts.driver import RolloutDriver
from inferway.gateway.rollouts.metrics import RolloutMetrics
from inferway.gateway.rollouts.sample_source import FleetWindows, build_rollout_source
from inferway.gateway.rollouts.store import RolloutStateStore, RolloutStore
from inferway.gateway.sources import StateSource
from inferway.gateway.supervisor import EnvoySupervisor
from inferway.policies.model import Policy
from inferway.resolve import IR
from inferway.state import State
from inferway.xds.auth import XdsClientTlsFiles
from inferway.xds.cache import SnapshotCache
from inferway.xds.node_groups import node_group
from inferway.xds.resources import Resources
from inferway.xds.translate import translate as translate_ir

__all__ = [
    "Wiring",
    "WiringOptions",
    "WiringPlan",
    "envoy_supervisor",
    "start_endpoints",
    "wire_control_plane",
]


class WiringOptions(BootstrapOptions, Protocol):
    """What the wiring reads of the gateway's options (``GatewayOptions`` is one)."""

    @property
    def policy_path(self) -> Path: ...
    @property
    def workdir(self) -> Path | None: ...
    @property
    def debounce_ms(self) -> int: ...
    @property
    def endpoints_file(self) -> Path | None: ...
    @property
    def keeper_state_file(self) -> Path | None: ...
    @property
    def translate(self) -> Callable[[IR], Resources] | None: ...
    @property
    def with_envoy(self) -> bool: ...
    @property
    def envoy_log_level(self) -> str: ...
    @property
    def envoy_concurrency(self) -> int | None: ...


class WiringPlan(Protocol):
    """What the wiring reads of the gateway's plan (``GatewayPlan`` is one)."""

    @property
    def policy(self) -> Policy: ...
    @property
    def state(self) -> State: ...
    @property
    def endpoints_path(self) -> Path | None: ...
    @property
    def endpoints_text(self) -> str: ...


def _keeper_view(options: WiringOptions) -> KeeperView | None:
    """The keeper's Envoy, for the admin API of its control-plane process."""
    if options.keeper_state_file is None:
        return None
    return KeeperView(
        options.keeper_state_file,
        envoy_admin_port=options.envoy_admin_port,
        concurrency=options.envoy_concurrency,
    )


@dataclass
class _EnvoyAdminPort:
    """The rollouts' metric source: our Envoy's admin port, the keeper's, or the given one."""

    options: WiringOptions
    keeper: KeeperView | None
    supervisor: EnvoySupervisor | None = None

    def __call__(self) -> int:
        if self.supervisor is not None:
            return self.supervisor.admin_port
        return self.keeper.admin_port if self.keeper is not None else self.options.envoy_admin_port


@dataclass(frozen=True)
class Wiring:
    """The control plane and what follows it, wired and with the plan applied (no sockets)."""

    cache: SnapshotCache
    plane: ControlPlane
    metrics: ControlPlaneMetrics
    rollouts: RolloutDriver
    rollouts_dir: Path
    certificates: CertificateSource
    follower: EndpointsFollower
    sources: list[StateSource]
    envoy_admin_port: _EnvoyAdminPort


def wire_control_plane(
    options: WiringOptions,
    plan: WiringPlan,
    *,
    rollout_store: RolloutStateStore | None = None,
    fleet_windows: FleetWindows | None = None,
) -> Wiring:
    """The cache, the control plane and its observers and state sources, then the first apply
    of ``plan`` (with the saved rollouts' weights: Envoy never sees them reset). A fleet's
    replica keeps rollout state in the shared store and judges every Envoy's counts."""
    path = options.policy_path
    cache = SnapshotCache(node_group=node_group)  # Envoys and proxyless gRPC clients
    plane = ControlPlane(cache, translate=options.translate or translate_ir)
    metrics = ControlPlaneMetrics.attach(plane)
    plane.add_observer(LogRedaction())  # before the first apply: it sets the names at start
    envoy_admin_port = _EnvoyAdminPort(options, _keeper_view(options))
    rollouts_dir = (
        options.workdir / "rollouts"
        if options.workdir is not None
        else Path(tempfile.mkdtemp(prefix="inferway-rollouts-"))
    )
    rollouts = RolloutDriver(
        plane,
        rollout_store or RolloutStore(rollouts_dir),
        lambda config: build_rollout_source(
            config,
            plane.policy,
            plane.state,
            envoy_admin_port,
            live=lambda: (plane.policy, plane.state),
            fleet=fleet_windows,
        ),
    )
    RolloutMetrics.attach(metrics.registry, rollouts)
    plane.add_observer(rollouts)  # resumes saved rollouts with the first apply
    certificates = CertificateSource(path.parent, source=str(path))
    certificates.follow(plan.policy)
    sources: list[StateSource] = [certificates.resolve_state]  # TLS files load with each edit
    follower = EndpointsFollower(plane, path, plan.endpoints_path, debounce_ms=options.debounce_ms)
    if options.endpoints_file is None:
        sources.append(follower.resolve_state)  # endpoints_file moves with edits
        plane.add_observer(follower)
    sources.append(rollouts.resolve_state)  # a policy edit keeps the rollouts' weights
    plane.apply_policy(
        plan.policy, str(path), state=rollouts.resolve_state(plan.policy, plan.state)
    )
    return Wiring(
        cache,
        plane,
        metrics,
        rollouts,
        rollouts_dir,
        certificates,
        follower,
        sources,
        envoy_admin_port,
    )


async def start_endpoints(
    components: Components, options: WiringOptions, plan: WiringPlan, wiring: Wiring
) -> EndpointsWatcher | EndpointsFollower:
    """``--endpoints-file``: the command line decides, edits do not (a plain watcher); else
    follow the policy's ``endpoints_file`` through edits."""
    if options.endpoints_file is not None:
        assert plan.endpoints_path is not None
        watcher = EndpointsWatcher(
            plan.endpoints_path, wiring.plane, debounce_ms=options.debounce_ms
        )
        watcher.mark_loaded(plan.endpoints_text)
        return await components.start("endpoints watcher", watcher)
    follower = wiring.follower
    components.adopt("endpoints follower", follower.stop)  # its start may move files part-way
    await follower.start(plan.endpoints_text)
    return follower


def envoy_supervisor(
    components: Components,
    options: WiringOptions,
    xds_port: int,
    xds_client_tls: XdsClientTlsFiles | None,
) -> EnvoySupervisor | None:
    """Envoy's supervisor, not started (None: this gateway runs no Envoy); its bootstrap
    points at ``xds_port``. Without a workdir it works in a temporary folder."""
    if not options.with_envoy:
        return None
    workdir = options.workdir.absolute() if options.workdir is not None else None
    if workdir is None:
        folder = tempfile.TemporaryDirectory(prefix="inferway-")
        components.adopt("Envoy's temporary folder", folder.cleanup)
        workdir = Path(folder.name)
    bootstrap = build_gateway_bootstrap(
        options, xds_port=xds_port, workdir=workdir, xds_client_tls=xds_client_tls
    )
    return EnvoySupervisor(
        bootstrap,
        workdir=workdir,
        log_level=options.envoy_log_level,
        concurrency=options.envoy_concurrency,
        env=provide_envoy_modules(bootstrap),
    )
