"""verify against a fleet: which Envoys to check, where each one's listener is, and which
split each one must show, all from the control plane's ``GET /status`` (every replica's, in a
fleet of replicas), never from a Service that hands the requests to a random pod.

Each Envoy is checked against the weights its own group's snapshot serves
(``served_weights``, read from the RouteConfigurations the control plane sends), at the
address the control plane knows for it (advertised in its bootstrap, or where its ADS stream
comes from); one whose address is unknown is refused by name. Pure code: the CLI
(cli/verify.py) fetches the documents, sends the requests and prints the verdict.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "EnvoyTarget",
    "FleetSelectionError",
    "envoy_overrides",
    "envoy_targets",
    "fleet_document",
    "gateway_url",
    "select_targets",
]


class FleetSelectionError(Exception):
    """The Envoys asked for cannot be checked (none known, an unknown ``--envoy``)."""


@dataclass(frozen=True)
class EnvoyTarget:
    """One Envoy as a control plane reports it."""

    node: str
    group: str
    address: str
    address_source: str
    connected: bool
    in_sync: bool
    acked_routes: str | None
    """The RouteConfiguration version it ACKed (None: none yet)."""
    served_version: str | None
    """The snapshot its group is served."""
    replica: str
    """The admin API that reported it."""
    routes: Mapping[str, Mapping[str, Mapping[str, float]]] = field(default_factory=dict)
    """Route configuration -> route -> cluster -> percent, as its group is served."""

    @property
    def zone(self) -> str:
        """``zone:<region>/<zone>`` groups name it; "" for the ``default`` group."""
        if not self.group.startswith("zone:"):
            return ""
        region, _, zone = self.group[len("zone:") :].partition("/")
        return "/".join(p for p in (region, zone) if p)


def envoy_targets(statuses: Iterable[tuple[str, Mapping[str, Any]]]) -> list[EnvoyTarget]:
    """Every Envoy node the ``(admin URL, GET /status document)`` pairs name, one per node id:
    the record of a replica it is connected to wins over one it left. Proxyless gRPC clients
    (``grpc`` groups) have no listener and are left out."""
    found: dict[str, EnvoyTarget] = {}
    for admin, status in statuses:
        served = status.get("served_weights") or {}
        for node in status.get("nodes") or []:
            group = str(node.get("group", ""))
            if group == "grpc" or group.startswith("grpc:"):
                continue
            acked = node.get("acked") or {}
            target = EnvoyTarget(
                node=str(node["node_id"]),
                group=group,
                address=str(node.get("address") or ""),
                address_source=str(node.get("address_source") or ""),
                connected=bool(node.get("connected")),
                in_sync=bool(node.get("in_sync")),
                acked_routes=acked.get("routes"),
                served_version=node.get("snapshot_version"),
                replica=admin,
                routes=(served.get(group) or {}).get("routes") or {},
            )
            known = found.get(target.node)
            if known is None or (target.connected and not known.connected):
                found[target.node] = target
    return [found[node] for node in sorted(found)]


def select_targets(
    targets: Sequence[EnvoyTarget], envoy: str | None
) -> tuple[list[EnvoyTarget], list[EnvoyTarget]]:
    """(to check, left out): ``envoy`` names one (it must be known and connected); else every
    connected Envoy, and the disconnected ones still listed are left out (a pod that went
    away is not a failure of the fleet)."""
    if envoy is not None:
        chosen = [t for t in targets if t.node == envoy]
        if not chosen:
            known = ", ".join(t.node for t in targets) or "none"
            raise FleetSelectionError(
                f"--envoy {envoy}: the control plane knows no such Envoy (known: {known})"
            )
        if not chosen[0].connected:
            raise FleetSelectionError(
                f"--envoy {envoy}: not connected to the control plane now (it left its stream)"
            )
        return chosen, []
    checked = [t for t in targets if t.connected]
    if not checked:
        raise FleetSelectionError("the control plane reports no connected Envoy to verify")
    return checked, [t for t in targets if not t.connected]


def gateway_url(target: EnvoyTarget, port: int) -> str:
    """The Envoy's listener URL; ValueError saying why when its address is unknown or not
    one a client can reach (a wildcard)."""
    host = target.address
    if not host:
        raise ValueError(
            f"Envoy {target.node}: its listener address is unknown (no --advertise-address "
            "and no ADS peer address recorded)"
        )
    try:
        parsed = ipaddress.ip_address(host)
    except ValueError:
        return f"http://{host}:{port}"
    if parsed.is_unspecified:
        raise ValueError(
            f"Envoy {target.node}: its address {host} ({target.address_source}) is a wildcard, "
            "not one to reach it at: start it with --advertise-address HOST"
        )
    return f"http://[{host}]:{port}" if parsed.version == 6 else f"http://{host}:{port}"


def envoy_overrides(
    target: EnvoyTarget,
    listeners: Iterable[str],
    backends: Mapping[str, Sequence[str]],
) -> tuple[dict[str, dict[str, float]], list[str]]:
    """The weights ``target`` is served on ``listeners`` as verify's overrides (route ->
    service -> percent, every backend of the route named, 0 where the served split leaves it
    out), and the problems: a route the policy has but its group is not served, or served
    clusters the policy's route does not name (the file is not what the control plane
    serves)."""
    served: dict[str, Mapping[str, float]] = {}
    for listener in listeners:
        for route, split in (target.routes.get(listener) or {}).items():
            served.setdefault(route, split)
    overrides: dict[str, dict[str, float]] = {}
    problems: list[str] = []
    for route, services in backends.items():
        if route not in served:
            problems.append(f"route {route}: not in the routes its group {target.group} is served")
            continue
        split = served[route]
        extra = sorted(set(split) - set(services))
        if extra:
            problems.append(
                f"route {route}: served to clusters {', '.join(extra)} that the policy's route "
                "does not name"
            )
            continue
        overrides[route] = {service: float(split.get(service, 0.0)) for service in services}
    return overrides, problems


def _failed_bars(run: Mapping[str, Any] | None) -> list[str]:
    if run is None:
        return []
    return [str(bar["name"]) for bar in run.get("bars", []) if bar.get("ok") is False]


def fleet_document(
    policy: str,
    admin: str,
    rows: Sequence[Mapping[str, Any]],
    skipped: Sequence[EnvoyTarget],
    problems: Sequence[str] = (),
) -> dict[str, Any]:
    """The fleet verdict (docs/verify.md): one row per Envoy (``ok`` false for a missed bar,
    an unsynced config or a problem; ``reachable`` false when it could not be checked), and a
    ``verdict`` sentence that names each Envoy that failed and why."""
    unreachable = [str(r["node"]) for r in rows if not r["reachable"]]
    failed = [str(r["node"]) for r in rows if r["reachable"] and not r["ok"]]
    reasons = []
    for row in rows:
        if not row["reachable"]:
            reasons.append(f"{row['node']} not checked: {row['problems'][0]}")
        elif not row["ok"]:
            why = [f"bar '{name}' missed" for name in _failed_bars(row.get("run"))]
            why += list(row["problems"])
            reasons.append(f"{row['node']} failed: {'; '.join(why)}")
    ok = not unreachable and not failed and not problems and bool(rows)
    checked = len(rows) - len(unreachable)
    head = f"{checked}/{len(rows)} Envoys checked"
    verdict = f"{head}, every one passed" if ok else "; ".join([head, *problems, *reasons])
    return {
        "ok": ok,
        "policy": policy,
        "admin": admin,
        "fleet": True,
        "verdict": verdict,
        "failed": failed,
        "unreachable": unreachable,
        "problems": list(problems),
        "skipped": [
            {"node": t.node, "reason": "disconnected from the control plane"} for t in skipped
        ],
        "envoys": list(rows),
    }
