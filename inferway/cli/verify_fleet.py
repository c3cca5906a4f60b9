"""``inferway verify --admin URL`` against a fleet: ask every control-plane replica which
Envoys it serves (each replica knows the Envoys whose ADS stream it holds), then check each
Envoy at its own listener against the split its group is served (tools/verify/fleet.py),
instead of the one URL a Service hands to a random pod (docs/verify.md, "A fleet")."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import typer
from rich.console import Console
from rich.text import Text

from inferway.cli.admin_client import AdminClient, AdminError
from inferway.console import make_console, print_issues
from inferway.exit_codes import EXIT_CANNOT_START, EXIT_INVALID, EXIT_UNREACHABLE
from inferway.policies.errors import PolicyError
from inferway.policies.model import Policy
from inferway.resolve.errors import ResolveError
from inferway.tools.verify.fleet import (
    EnvoyTarget,
    FleetSelectionError,
    gateway_url,
    select_targets,
)
from inferway.tools.verify.fleet_run import run_fleet
from inferway.tools.verify.load import is_loopback
from inferway.tools.verify.openai_checks import OpenAITarget, openai_targets
from inferway.tools.verify.routes import VerifyRoute, load_verify_routes
from inferway.tools.verify.run import VerifySettings

__all__ = ["fleet_statuses", "verify_fleet"]


def _fail(message: str, code: int) -> typer.Exit:
    Console(stderr=True).print(Text(message, style="red"))
    return typer.Exit(code)


def fleet_statuses(admin: str) -> tuple[list[tuple[str, Mapping[str, Any]]], list[str]]:
    """``GET /status`` of ``admin`` and of every other replica its fleet lists; a replica that
    does not answer is a problem (its Envoys cannot be checked), not a crash."""
    try:
        first = AdminClient(admin).status()
    except AdminError as error:
        raise _fail(str(error), error.exit_code) from None
    statuses: list[tuple[str, Mapping[str, Any]]] = [(admin, first)]
    problems: list[str] = []
    fleet = first.get("fleet") or {}
    for replica in fleet.get("replicas") or []:
        url = replica.get("admin")
        if replica.get("id") == fleet.get("this") or not url:
            continue
        try:
            statuses.append((url, AdminClient(url).status()))
        except AdminError as error:
            problems.append(
                f"replica {replica.get('id')} at {url} did not answer ({error}): the Envoys "
                "connected to it are not checked"
            )
    return statuses, problems


def _policy(file: Path) -> Policy:
    try:
        policy, _ = load_verify_routes(file)
    except (PolicyError, ResolveError) as error:
        issues = error.issues if isinstance(error, PolicyError) else []
        if issues:
            print_issues(make_console(stderr=True), issues)
        else:
            make_console(stderr=True).print(Text(f"{file}: {error}", style="red"))
        raise typer.Exit(EXIT_INVALID) from None
    return policy


def _port(policy: Policy, gateway: str | None) -> int:
    """The listener to check: --gateway's port, else the policy's only listener."""
    if gateway is not None:
        port = urlsplit(gateway).port
        if port is None:
            raise _fail(f"--gateway {gateway}: give the listener's port", 2)
        return port
    if len(policy.listeners) != 1:
        raise _fail(
            f"the policy has {len(policy.listeners)} listeners: give --gateway URL (its port "
            "picks the listener to check on every Envoy)",
            2,
        )
    return int(policy.listeners[0].port)


def _backends(policy: Policy, listeners: set[str]) -> dict[str, list[str]]:
    """Policy route -> its services, for the routes served on ``listeners``."""
    out: dict[str, list[str]] = {}
    for route in policy.routes:
        if listeners and route.listeners is not None and not listeners & set(route.listeners):
            continue
        if route.backends:
            out[route.name] = [b.service for b in route.backends]
    return out


def verify_fleet(
    file: Path,
    admin: str,
    gateway: str | None,
    targets: Sequence[EnvoyTarget],
    problems: Sequence[str],
    envoy: str | None,
    settings: VerifySettings,
    allow_remote: bool,
) -> dict[str, Any]:
    """The fleet document for the Envoys chosen (every connected one, or ``envoy``)."""
    policy = _policy(file)
    port = _port(policy, gateway)
    try:
        chosen, skipped = select_targets(targets, envoy)
    except FleetSelectionError as error:
        raise _fail(f"{admin}: {error}", EXIT_UNREACHABLE) from None
    if settings.users is not None and not allow_remote:
        for target in chosen:
            try:
                url = gateway_url(target, port)
            except ValueError:
                continue
            if not is_loopback(url):
                message = (
                    f"Envoy {target.node} at {url} is not loopback: load only with --allow-remote"
                )
                raise _fail(message, EXIT_CANNOT_START)
    if settings.png is not None and len(chosen) > 1:
        raise _fail("--png draws one Envoy's load run: name it with --envoy NODE", 2)
    listeners = {lst.name for lst in policy.listeners if lst.port == port}

    def routes_for(overrides: Mapping[str, Mapping[str, float]]) -> list[VerifyRoute]:
        _, routes = load_verify_routes(file, port, overrides)
        return routes

    def openai_for(overrides: Mapping[str, Mapping[str, float]]) -> list[OpenAITarget]:
        return openai_targets(policy, port, overrides)

    return asyncio.run(
        run_fleet(
            str(file),
            admin,
            chosen,
            skipped,
            port=port,
            listeners=sorted(listeners),
            backends=_backends(policy, listeners),
            routes_for=routes_for,
            settings=settings,
            problems=problems,
            openai_for=openai_for,
        )
    )
