"""One verify run per Envoy of a fleet, each at its own listener and against its own served
split (fleet.py chooses them), one after the other so that no Envoy's answers wait on
another's; the rows and the verdict go into one document (``fleet_document``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import httpx

from inferway.tools.verify.fleet import (
    EnvoyTarget,
    envoy_overrides,
    fleet_document,
    gateway_url,
)
from inferway.tools.verify.openai_checks import OpenAITarget
from inferway.tools.verify.routes import VerifyRoute
from inferway.tools.verify.run import VerifySettings, run_verify

__all__ = ["OpenAIFor", "RoutesFor", "run_fleet"]

RoutesFor = Callable[[Mapping[str, Mapping[str, float]]], list[VerifyRoute]]
"""The policy's routes on the checked listener with these weight overrides."""
OpenAIFor = Callable[[Mapping[str, Mapping[str, float]]], list[OpenAITarget]]
"""Its openai routes there, likewise (openai_checks.py)."""


def _row(target: EnvoyTarget, gateway: str | None) -> dict[str, Any]:
    return {
        "node": target.node,
        "zone": target.zone,
        "group": target.group,
        "address": target.address,
        "address_source": target.address_source,
        "gateway": gateway,
        "replica": target.replica,
        "in_sync": target.in_sync,
        "acked_routes": target.acked_routes,
        "served_version": target.served_version,
        "weights": {},
        "reachable": gateway is not None,
        "ok": False,
        "problems": [],
        "run": None,
    }


async def _reach(url: str) -> str | None:
    """None when something answers HTTP at ``url``; else why not."""
    try:
        async with httpx.AsyncClient(timeout=5.0) as client:
            await client.get(url)
    except httpx.HTTPError as error:
        return f"cannot reach its listener at {url}: {error!r}"
    return None


async def run_fleet(
    policy: str,
    admin: str,
    targets: Sequence[EnvoyTarget],
    skipped: Sequence[EnvoyTarget],
    *,
    port: int,
    listeners: Iterable[str],
    backends: Mapping[str, Sequence[str]],
    routes_for: RoutesFor,
    settings: VerifySettings,
    problems: Sequence[str] = (),
    openai_for: OpenAIFor | None = None,
) -> dict[str, Any]:
    """The fleet document: every target checked at ``port`` on its own address, against the
    split its group is served on ``listeners`` (``backends``: policy route -> services)."""
    names = list(listeners)
    rows = []
    for target in targets:
        try:
            url = gateway_url(target, port)
        except ValueError as error:
            row = _row(target, None)
            row["problems"].append(str(error))
            rows.append(row)
            continue
        unreachable = await _reach(url)
        if unreachable is not None:
            row = _row(target, None)
            row["problems"].append(f"Envoy {target.node}: {unreachable}")
            rows.append(row)
            continue
        row = _row(target, url)
        overrides, mismatches = envoy_overrides(target, names, backends)
        row["weights"] = overrides
        row["problems"].extend(mismatches)
        if not target.in_sync:
            row["problems"].append(
                f"config not in sync: it has not ACKed the snapshot its group is served "
                f"({target.served_version}); routes ACKed: {target.acked_routes}"
            )
        openai = openai_for(overrides) if openai_for is not None else None
        run = await run_verify(policy, url, routes_for(overrides), settings, openai)
        row["run"] = run
        row["ok"] = bool(run["ok"]) and not row["problems"]
        rows.append(row)
    return fleet_document(policy, admin, rows, skipped, problems)
