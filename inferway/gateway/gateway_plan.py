"""What a gateway is told and what it would serve, before any socket is opened.

:class:`GatewayOptions` is everything ``inferway run`` can be told; :func:`plan_gateway` reads
the policy, runs its sources (the endpoints file, the certificate files), resolves and
translates into a consistent snapshot. ``inferway validate`` and ``render`` stop there;
:func:`inferway.gateway.runtime.start_gateway` starts from the same plan, so what
``validate`` accepts is what ``run`` accepts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from inferway.gateway.actuators.scale_actuators import KubernetesFactory
from inferway.gateway.admin_documents import DEFAULT_ADMIN_PORT
from inferway.gateway.cert_watcher import load_tls_secrets
from inferway.gateway.endpoints_watcher import load_initial_endpoints
from inferway.gateway.loop_configs import LoopConfigs, compile_loops
from inferway.gateway.xds_mtls import XdsMtlsFiles
from inferway.policies import load_policy_text
from inferway.policies.endpoints import endpoints_file_path
from inferway.policies.errors import PolicyError, read_source_text
from inferway.policies.located import place_issues
from inferway.policies.model import Policy
from inferway.resolve import IR
from inferway.state import State
from inferway.xds.policy_snapshot import build_policy_snapshot
from inferway.xds.resources import Resources
from inferway.xds.server import DEFAULT_MAX_CONNECTION_AGE_S
from inferway.xds.snapshot import Snapshot

__all__ = [
    "DEFAULT_ENVOY_ADMIN_PORT",
    "DEFAULT_XDS_PORT",
    "GatewayOptions",
    "GatewayPlan",
    "plan_gateway",
]

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
