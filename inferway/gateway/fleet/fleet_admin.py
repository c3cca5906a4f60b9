"""The fleet in the admin API: ``status`` on any replica names the leader, every replica, the
store's health and every Envoy that reports; a rollout command sent to a replica that does not
lead is forwarded to the leader's admin API (with the caller's token), so commands work against
any replica and are decided once. ``GET /autoscale`` (``scale status``) is forwarded too: the
autoscaler runs on the leader only, so every replica answers with the leader's document."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
from aiohttp import web

from inferway.gateway.admin import FLEET_STATUS
from inferway.gateway.autoscale_admin import AUTOSCALE_FORWARD
from inferway.gateway.fleet.fleet_limits import local_limit_warnings
from inferway.gateway.fleet.fleet_wiring import Fleet
from inferway.gateway.rollouts.admin_routes import FORWARD

__all__ = ["add_fleet_routes", "fleet_status"]


def fleet_status(fleet: Fleet) -> dict[str, Any]:
    now = time.time()
    leading = fleet.leader is not None and fleet.leader.status.leading
    return {
        "store": fleet.health_json(),
        "this": fleet.identity,
        "leading": leading,
        "leader": fleet.current_leader(),
        "replicas": [
            {"id": r["id"], "admin": r["admin"], "leading": r["leading"], "age_s": now - r["at"]}
            for r in fleet.replicas()
        ],
        "envoys": [
            {"node": node, "zone": report.zone, "age_s": round(now - report.at, 1)}
            for node, report in sorted(fleet.evidence.reports().items())
        ],
        "envoys_gone": [
            {"node": node, "zone": report.zone, "age_s": round(now - report.at, 1)}
            for node, report in sorted(fleet.evidence.expired().items())
        ],
        **_limits(fleet),
    }


def _limits(fleet: Fleet) -> dict[str, Any]:
    """Each fleet-wide limit's split, and a warning for each per-Envoy limit that several
    Envoys serve (the fleet admits it once per Envoy)."""
    if fleet.limits is None:
        return {}
    envoys = len(fleet.evidence.reports())
    return {
        "rate_limit_splits": fleet.limits.splits(),
        "warnings": local_limit_warnings(fleet.limits.plane.policy, envoys),
    }


def _forwarder(fleet: Fleet) -> Any:
    async def forward(request: web.Request) -> web.Response | None:
        if fleet.leader is not None and fleet.leader.status.leading:
            return None
        admin = fleet.leader_admin()
        if admin is None:
            return web.json_response(
                {"error": "no replica leads the fleet right now (an election is under way)"},
                status=503,
                headers={"Retry-After": "1"},
            )
        headers = {k: v for k, v in request.headers.items() if k.lower() == "authorization"}
        url = admin.rstrip("/") + request.path_qs
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
                session.request(
                    request.method, url, data=await request.read(), headers=headers
                ) as answer,
            ):
                body = await answer.read()
                return web.Response(
                    body=body,
                    status=answer.status,
                    content_type=answer.content_type,
                    headers={"X-Inferway-Forwarded-To": fleet.current_leader() or ""},
                )
        except (aiohttp.ClientError, TimeoutError) as exc:
            return web.json_response(
                {"error": f"the leader's admin API at {admin} did not answer: {exc}"},
                status=502,
            )

    return forward


def add_fleet_routes(app: web.Application, fleet: Fleet) -> None:
    """Before the app starts (aiohttp freezes it then)."""
    app[FLEET_STATUS] = lambda: fleet_status(fleet)
    app[FORWARD] = _forwarder(fleet)
    app[AUTOSCALE_FORWARD] = app[FORWARD]
