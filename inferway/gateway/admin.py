"""The gateway's admin API: what is live, what was refused, and what each Envoy accepted.

Loopback only by default: it reveals the whole policy, so exposing it is a deliberate choice.
``build_status`` is a pure function of the control plane's state so the demo and the tests
read exactly what ``GET /status`` serves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from inferway.gateway.admin_documents import (
    DEFAULT_ADMIN_PORT,
    EnvoyRecord,
    FileProblemRecord,
    HealthRecord,
    NackRecord,
    NodeRecord,
    RefusalRecord,
    StatusDocument,
)
from inferway.gateway.admin_security import (
    ADMIN_TOKEN,
    MAX_BODY_BYTES,
    RELOAD,
    ReloadCallable,
    admin_security_middleware,
    reload_handler,
)
from inferway.gateway.control_plane import DEGRADED_REJECTED, ControlPlane, Refusal
from inferway.gateway.control_plane_metrics import CONTENT_TYPE, ControlPlaneMetrics
from inferway.gateway.fleet.fleet_limits import local_limit_warnings
from inferway.gateway.keeper_state import KeeperView
from inferway.gateway.picker.keeper import worker_warnings
from inferway.gateway.supervisor import EnvoySupervisor
from inferway.policies import dump_policy
from inferway.policies.redact import build_redacted_policy
from inferway.xds import type_urls
from inferway.xds.cache import node_in_sync
from inferway.xds.node_groups import parse_group
from inferway.xds.records import NackRecord as XdsNackRecord
from inferway.xds.records import NodeStatus
from inferway.xds.served_weights import served_route_weights
from inferway.xds.snapshot import Snapshot

__all__ = [
    "CONTROL_PLANE",
    "DEFAULT_ADMIN_PORT",
    "ENVOY_ADMIN_PORT",
    "METRICS",
    "SUPERVISOR",
    "WATCHERS",
    "AdminServer",
    "build_admin_app",
    "build_status",
    "start_admin_server",
]


CONTROL_PLANE = web.AppKey("control_plane", ControlPlane)
SUPERVISOR: web.AppKey[EnvoySupervisor | KeeperView] = web.AppKey("supervisor")
XDS_REFUSALS: web.AppKey[Callable[[], list[Any]]] = web.AppKey("xds_refusals")
METRICS = web.AppKey("metrics", ControlPlaneMetrics)
ENVOY_ADMIN_PORT: web.AppKey[Callable[[], int | None]] = web.AppKey("envoy_admin_port")
FLEET_STATUS: web.AppKey[Callable[[], dict[str, Any]]] = web.AppKey("fleet_status")
"""A fleet replica's part of ``GET /status`` (gateway/fleet/fleet_admin.py)."""
PICKERS_STATUS: web.AppKey[Callable[[], dict[str, Any]]] = web.AppKey("pickers_status")
"""The endpoint pickers' part of ``GET /status`` (gateway/picker/keeper.py)."""
WATCHERS: web.AppKey[Callable[[], list[dict[str, Any]]]] = web.AppKey("watchers")
"""Each file watcher's health (watch_health.WatchHealth.document), for ``watchers``."""
# Query parameters of Envoy's /stats/prometheus that are passed through (all read-only).
_ENVOY_STATS_PARAMS = ("usedonly", "filter", "text_readouts", "histogram_buckets")


def build_status(
    plane: ControlPlane, supervisor: EnvoySupervisor | KeeperView | None = None
) -> StatusDocument:
    """The JSON document ``GET /status`` returns (``admin_documents.StatusDocument``, what
    the CLI's ``AdminClient`` reads). ``keeper``: under ``inferway run``, the
    keeper process that owns Envoy and the control plane's restarts (None in-process)."""
    current = plane.current
    refusal = plane.last_refused
    return {
        "health": _health(plane),
        "policy": None
        if current is None
        else {
            "version": current.version,
            "applied_at": current.applied_at,
            "source": current.source,
            "versions": {
                type_urls.SHORT_NAMES.get(t, t): v for t, v in current.snapshot.versions.items()
            },
        },
        "last_refused": None if refusal is None else _refusal(refusal, plane.refusal_pending),
        "file_problems": [
            FileProblemRecord(file=p.file, kind=p.kind, message=p.message, since=p.since)
            for p in plane.file_problems
        ],
        "nodes": [
            _node(node, plane.cache.get_snapshot(node.group)) for node in plane.cache.node_status()
        ],
        "nacks": [_nack(record) for record in plane.cache.nacks()],
        "envoy": None if supervisor is None else _envoy(supervisor),
        "keeper": supervisor.keeper_status() if isinstance(supervisor, KeeperView) else None,
    }


def _health(plane: ControlPlane) -> HealthRecord:
    """``ok``, or ``degraded: last edit rejected by Envoy`` with the reason; the gateway still
    serves the last good snapshot either way."""
    degraded = plane.degraded
    if degraded is None:
        return {"ok": True, "status": "ok", "reason": None}
    return {"ok": False, "status": DEGRADED_REJECTED, "reason": degraded}


def _refusal(refusal: Refusal, pending: bool) -> RefusalRecord:
    rejection = refusal.rejected_by_envoy
    return {
        "at": refusal.at,
        "file": refusal.file,
        "pending": pending,
        "rejected_by_envoy": None
        if rejection is None
        else {
            "node_id": rejection.nack.node_id,
            "type": type_urls.SHORT_NAMES.get(rejection.nack.type_url, rejection.nack.type_url),
            "snapshot": rejection.version,
            "resource_names": list(rejection.nack.resource_names),
            "message": rejection.message,
            "restored": rejection.restored,
        },
        "issues": [
            {
                "file": issue.file,
                "line": issue.line,
                "column": issue.column,
                "path": issue.path,
                "message": issue.message,
                "text": str(issue),
            }
            for issue in refusal.issues
        ],
    }


def _node(node: NodeStatus, snapshot: Snapshot | None) -> NodeRecord:
    return {
        "node_id": node.node_id,
        "cluster": node.cluster,
        "group": node.group,
        "connected": node.connected,
        "connected_since": node.connected_since,
        "last_seen": node.last_seen,
        "acked": {type_urls.SHORT_NAMES.get(t, t): v for t, v in sorted(node.acked.items())},
        "in_sync": snapshot is not None and node_in_sync(node, snapshot),
        "snapshot_version": None if snapshot is None else snapshot.version,
        "last_nack": None if node.last_nack is None else _nack(node.last_nack),
        "address": node.address,
        "address_source": node.address_source,
    }


def _served_weights(plane: ControlPlane) -> dict[str, dict[str, Any]]:
    """The split each group of a known node is served, for ``inferway verify``."""
    out: dict[str, dict[str, Any]] = {}
    for group in sorted({node.group for node in plane.cache.node_status()}):
        snapshot = plane.cache.get_snapshot(group)
        out[group] = {
            "version": None if snapshot is None else snapshot.version,
            "routes": served_route_weights(snapshot),
        }
    return out


def _nack(record: XdsNackRecord) -> NackRecord:
    return {
        "node_id": record.node_id,
        "type": type_urls.SHORT_NAMES.get(record.type_url, record.type_url),
        "version": record.version,
        "nonce": record.nonce,
        "message": record.message,
        "at": record.at,
    }


def _envoy(supervisor: EnvoySupervisor | KeeperView) -> EnvoyRecord:
    return {
        "pid": supervisor.pid,
        "running": supervisor.running,
        "restarts": supervisor.restarts,
        "last_exit_code": supervisor.last_exit_code,
        "admin_port": supervisor.admin_port,
    }


async def _status(request: web.Request) -> web.Response:
    app = request.app
    document = build_status(app[CONTROL_PLANE], app.get(SUPERVISOR))
    document["served_weights"] = _served_weights(app[CONTROL_PLANE])
    refusals = app.get(XDS_REFUSALS)
    if refusals is not None:
        document["xds_refused"] = [vars(r) | {"identities": list(r.identities)} for r in refusals()]
    fleet = app.get(FLEET_STATUS)
    if fleet is not None:
        document["fleet"] = fleet()
    pickers = app.get(PICKERS_STATUS)
    if pickers is not None and (picked := pickers()):
        document["pickers"] = picked
    plane = app[CONTROL_PLANE]
    envoys = sum(
        1 for n in plane.cache.node_status() if n.connected and parse_group(n.group).kind == "envoy"
    )
    warnings = local_limit_warnings(plane.policy, envoys)
    supervisor = app.get(SUPERVISOR)
    if supervisor is not None:  # the Envoy this gateway runs (with --no-envoy: not known)
        warnings += worker_warnings(plane.policy, supervisor.concurrency)
    if warnings:
        document["warnings"] = warnings
    watchers = app.get(WATCHERS)
    if watchers is not None:
        document["watchers"] = watchers()
    return web.json_response(document)


async def _healthz(request: web.Request) -> web.Response:
    """200 while the gateway serves (a probe must not restart it for a rejected edit: the
    last good config serves); ``ok`` is false and ``status`` says why while degraded."""
    plane = request.app[CONTROL_PLANE]
    return web.json_response(_health(plane) | {"policy_version": plane.version})


async def _metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def _envoy_stats(request: web.Request) -> web.Response:
    """Envoy's own /stats/prometheus, fetched from its loopback-only admin port, so Prometheus
    scrapes the gateway and Envoy's admin (which can also stop Envoy) never leaves loopback."""
    port_of = request.app.get(ENVOY_ADMIN_PORT)
    port = None if port_of is None else port_of()
    if port is None:
        raise web.HTTPNotFound(text="this gateway runs no Envoy (started with --no-envoy?)\n")
    params = {k: v for k, v in request.query.items() if k in _ENVOY_STATS_PARAMS}
    url = f"http://127.0.0.1:{port}/stats/prometheus"
    try:
        timeout = aiohttp.ClientTimeout(total=5.0)
        async with (
            aiohttp.ClientSession(timeout=timeout, trust_env=False) as session,
            session.get(url, params=params) as response,
        ):
            body = await response.read()
            status = response.status
            content_type = response.headers.get("Content-Type", CONTENT_TYPE)
    except (aiohttp.ClientError, TimeoutError) as exc:
        reason = str(exc) or type(exc).__name__
        raise web.HTTPServiceUnavailable(
            text=f"Envoy admin at 127.0.0.1:{port} did not answer /stats/prometheus: {reason}\n"
        ) from None
    if status != 200:
        raise web.HTTPBadGateway(
            text=f"Envoy admin at 127.0.0.1:{port} answered {status} for /stats/prometheus\n"
        )
    return web.Response(body=body, headers={"Content-Type": content_type})


async def _policy(request: web.Request) -> web.Response:
    """The live policy, with access rules' header values (API keys) shown as <redacted>."""
    policy = request.app[CONTROL_PLANE].policy
    if policy is None:
        raise web.HTTPNotFound(text="no policy has been applied yet\n")
    shown = dump_policy(build_redacted_policy(policy))
    return web.Response(text=shown, content_type="application/yaml")


def build_admin_app(
    plane: ControlPlane,
    supervisor: EnvoySupervisor | KeeperView | None = None,
    *,
    metrics: ControlPlaneMetrics | None = None,
    envoy_admin_port: Callable[[], int | None] | None = None,
    token: str | None = None,
    reload: ReloadCallable | None = None,
    xds_refusals: Callable[[], list[Any]] | None = None,
    watchers: Callable[[], list[dict[str, Any]]] | None = None,
) -> web.Application:
    """``metrics`` defaults to a ControlPlaneMetrics attached now (attach it before the first
    apply to count it); ``envoy_admin_port`` defaults to the supervisor's admin port."""
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[admin_security_middleware])
    app[CONTROL_PLANE] = plane
    if token is not None:  # without a token every state-changing request is refused
        app[ADMIN_TOKEN] = token
    if reload is not None:
        app[RELOAD] = reload
    if xds_refusals is not None:
        app[XDS_REFUSALS] = xds_refusals
    if watchers is not None:
        app[WATCHERS] = watchers
    app[METRICS] = metrics if metrics is not None else ControlPlaneMetrics.attach(plane)
    if supervisor is not None:
        app[SUPERVISOR] = supervisor
        if envoy_admin_port is None:
            envoy_admin_port = lambda: supervisor.admin_port  # noqa: E731
    if envoy_admin_port is not None:
        app[ENVOY_ADMIN_PORT] = envoy_admin_port
    app.router.add_get("/status", _status)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/policy", _policy)
    app.router.add_post("/reload", reload_handler)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/envoy/stats/prometheus", _envoy_stats)
    return app


@dataclass
class AdminServer:
    runner: web.AppRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start_admin_server(
    app: web.Application, *, host: str = "127.0.0.1", port: int = DEFAULT_ADMIN_PORT
) -> AdminServer:
    """Serve ``app`` on ``host:port`` (port 0 picks a free one); returns the bound address."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    bound = runner.addresses[0][1] if runner.addresses else port
    return AdminServer(runner, host, int(bound))
