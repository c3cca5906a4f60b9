"""``inferway validate``'s checks of one file: the plan ``run`` would start (and, with
``--envoy``, the real Envoy's verdict mapped to the policy's lines), as located issues or a
summary of what the file configures (``validate -o json``'s ``summary``, docs/cli.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.text import Text

from inferway.console import short_version
from inferway.gateway.gateway_plan import GatewayOptions, GatewayPlan, plan_gateway
from inferway.policies import Policy, PolicyError
from inferway.policies.errors import PolicyIssue

if TYPE_CHECKING:
    from inferway.xds.resources import Resources

__all__ = ["check_policy_file", "envoy_issues", "print_summary", "summarize_plan"]


def check_policy_file(
    file: Path, endpoints_file: Path | None, *, envoy: bool
) -> tuple[list[PolicyIssue], dict[str, Any] | None]:
    """One file's issues and no summary, or no issues and the summary of what it configures.
    Raises FileNotFoundError when ``envoy`` is asked for and there is no Envoy binary."""
    try:
        plan = plan_gateway(GatewayOptions(policy_path=file, endpoints_file=endpoints_file))
    except PolicyError as error:
        return list(error.issues), None
    if envoy:
        issues = envoy_issues(file, plan.policy, plan.snapshot.resources)
        if issues:
            return issues, None
    return [], summarize_plan(plan, envoy=envoy)


def summarize_plan(plan: GatewayPlan, *, envoy: bool) -> dict[str, Any]:
    """``listeners`` and ``services`` (counts), ``routes`` (name, backends with service and
    weight), ``snapshot`` (the version run would push), ``envoy`` ("ok" with --envoy, else
    null)."""
    policy = plan.policy
    return {
        "listeners": len(policy.listeners),
        "services": len(policy.services),
        "routes": [
            {
                "name": route.name,
                "backends": [{"service": b.service, "weight": b.weight} for b in route.backends],
            }
            for route in policy.routes
        ],
        "snapshot": plan.snapshot.version,
        "envoy": "ok" if envoy else None,
    }


def print_summary(console: Console, file: str, summary: dict[str, Any]) -> None:
    """The text form: ``ok FILE: ...`` and one line per route with its split."""
    routes = summary["routes"]
    text = Text()
    text.append("ok ", style="green")
    text.append(
        f"{file}: {summary['listeners']} listener(s), {summary['services']} service(s), "
        f"{len(routes)} route(s); snapshot {short_version(str(summary['snapshot']))}"
        + ("; envoy --mode validate: ok" if summary["envoy"] else "")
    )
    console.print(text)
    for route in routes:
        split = " / ".join(f"{b['service']} {b['weight']:g}%" for b in route["backends"])
        console.print(Text(f"  route {route['name']}: {split}"))


def envoy_issues(path: Path, policy: Policy, resources: Resources) -> list[PolicyIssue]:
    """``validate --envoy``: Envoy's verdict as issues located on the policy lines it is about
    (none: Envoy accepts it). Raises FileNotFoundError without an Envoy binary."""
    from inferway.policies.checks_envoy import locate_envoy_message
    from inferway.policies.errors import read_source_text
    from inferway.policies.located import locate_issue, parse_located
    from inferway.xds.envoy_validate import validate_with_envoy

    verdict = validate_with_envoy(resources)
    if verdict.ok:
        return []
    message = f"Envoy refuses this: {verdict.message}"
    document, _ = parse_located(read_source_text(path), str(path))
    locs = locate_envoy_message(policy, verdict.message)
    return [locate_issue(document, str(path), loc, message) for loc in locs] or [
        PolicyIssue(str(path), None, None, "", message)
    ]
