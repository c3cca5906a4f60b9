"""``inferway verify``: the functional, load and cost checks of a live gateway against the
policy it should be running, with an exit code a rollout gate reads (docs/verify.md).

The checks' libraries (rstr, scipy, locust, matplotlib) are the ``verify`` extra, imported
by the modules that use them only when they run, so a gateway without them starts as
before and ``verify`` says which extra it needs.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import httpx
import typer
from rich.console import Console
from rich.text import Text

from inferway.cli.admin_client import AdminClient, AdminError
from inferway.cli.output import OutputFormat, OutputOption, write_document
from inferway.cli.verify_fleet import fleet_statuses, verify_fleet
from inferway.console import make_console, print_issues
from inferway.exit_codes import (
    EXIT_BAR_MISSED,
    EXIT_CANNOT_START,
    EXIT_INVALID,
    EXIT_UNREACHABLE,
)
from inferway.policies.errors import PolicyError
from inferway.policies.types import parse_duration
from inferway.resolve.errors import ResolveError
from inferway.tools.verify.fleet import envoy_targets
from inferway.tools.verify.fleet_report import render_fleet
from inferway.tools.verify.live import rollout_weights
from inferway.tools.verify.load import is_loopback
from inferway.tools.verify.openai_checks import openai_targets
from inferway.tools.verify.report import render_run
from inferway.tools.verify.routes import load_verify_routes
from inferway.tools.verify.run import VerifySettings, run_verify

__all__ = ["verify"]

_NEEDS = ("rstr", "scipy", "locust", "matplotlib")


def _seconds(value: str) -> float:
    """``60s``, ``50ms``, ``1m`` or a bare number of seconds."""
    try:
        return float(value)
    except ValueError:
        pass
    try:
        parsed = parse_duration(value)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    assert isinstance(parsed, float)
    return parsed


def _cpus(value: str | None) -> tuple[int, ...]:
    """``--load-cpus 0,1`` -> (0, 1); a CPU this process may not use is a usage error."""
    if value is None:
        return ()
    try:
        cpus = tuple(sorted({int(part) for part in value.split(",") if part.strip()}))
    except ValueError:
        raise _fail(f"--load-cpus {value!r}: give CPU numbers, e.g. 0 or 0,1", 2) from None
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(cpus)
    outside = [c for c in cpus if c not in allowed]
    if not cpus or outside:
        raise _fail(f"--load-cpus {value!r}: usable CPUs are {sorted(allowed)}", 2)
    return cpus


def _fail(message: str, code: int) -> typer.Exit:
    Console(stderr=True).print(Text(message, style="red"))
    return typer.Exit(code)


def _live_weights(admin: str) -> dict[str, dict[str, float]]:
    """The weights the gateway runs now where a rollout moved them (``GET /rollouts``; none
    when it has no rollouts): verify expects the live split, not the policy's start."""
    try:
        rollouts = AdminClient(admin).rollouts(missing_ok=True)
    except AdminError as error:
        raise _fail(str(error), error.exit_code) from None
    try:
        return rollout_weights({"rollouts": rollouts})
    except (ValueError, KeyError, TypeError) as error:
        message = f"{admin.rstrip('/')}/rollouts did not answer the rollouts document: {error}"
        raise _fail(message, EXIT_UNREACHABLE) from None


def _reachable(gateway: str) -> None:
    try:
        httpx.get(gateway, timeout=5.0)
    except httpx.HTTPError as error:
        raise _fail(f"cannot reach the gateway at {gateway}: {error}", EXIT_UNREACHABLE) from None


def verify(
    file: Annotated[
        Path,
        typer.Option("--file", "-f", help="The policy the gateway should run.", dir_okay=False),
    ],
    gateway: Annotated[
        str | None,
        typer.Option(
            help="The gateway's listener URL, e.g. http://127.0.0.1:10000 (with --admin and a "
            "fleet: only its port is used, each Envoy is reached at its own address)."
        ),
    ] = None,
    requests: Annotated[
        int, typer.Option(min=1, help="Functional requests (at least one per generated case).")
    ] = 1000,
    concurrency: Annotated[int, typer.Option(min=1, help="Functional requests in flight.")] = 8,
    min_correct: Annotated[
        float, typer.Option(min=0, max=100, help="Correctness bar, % routed as the policy says.")
    ] = 99.9,
    alpha: Annotated[
        float, typer.Option(min=0, max=1, help="Chi-square significance: p below it fails.")
    ] = 0.001,
    users: Annotated[
        int | None, typer.Option(min=1, help="Run the locust load part with this many users.")
    ] = None,
    duration: Annotated[str, typer.Option(help="Load duration (60s, 2m).")] = "60s",
    spawn_rate: Annotated[
        float | None, typer.Option(help="Users started per second (default: all in 1 s).")
    ] = None,
    think_time: Annotated[str, typer.Option(help="Each user's wait between requests.")] = "0s",
    exclude_ramp: Annotated[
        bool,
        typer.Option(
            "--exclude-ramp",
            help="Judge only requests sent once every user has started (the ramp is reported "
            "beside), as locust's --reset-stats.",
        ),
    ] = False,
    load_cpus: Annotated[
        str | None,
        typer.Option(help="CPUs locust may run on (0 or 0,1): keep it off the gateway's cores."),
    ] = None,
    sla_p99: Annotated[str, typer.Option(help="The load run's p99 bar (50ms).")] = "50ms",
    max_errors: Annotated[
        float, typer.Option(min=0, max=100, help="Load errors bar, % (5xx, no answer).")
    ] = 0.5,
    prometheus: Annotated[
        str | None, typer.Option(help="Prometheus with inferway_cost_* / utilisation series.")
    ] = None,
    admin: Annotated[
        str | None,
        typer.Option(help="The gateway's admin API: live rollout weights, and /metrics for cost."),
    ] = None,
    min_utilization: Annotated[
        float | None, typer.Option(min=0, max=100, help="Utilisation bar, % (none by default).")
    ] = None,
    allow_remote: Annotated[
        bool, typer.Option("--allow-remote", help="Allow load on a non-loopback gateway.")
    ] = False,
    png: Annotated[
        Path | None,
        typer.Option(help="Write the load run's latency over time here.", dir_okay=False),
    ] = None,
    json_file: Annotated[
        Path | None,
        typer.Option("--json", help="Also write the JSON document here.", dir_okay=False),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the generated cases.")] = 0,
    envoy: Annotated[
        str | None,
        typer.Option(help="Check this Envoy (node id) of the fleet --admin reports, only."),
    ] = None,
    all_envoys: Annotated[
        bool,
        typer.Option(
            "--all-envoys",
            help="Check every connected Envoy --admin reports, each at its own listener "
            "(the default when it reports more than one).",
        ),
    ] = False,
    output: OutputOption = OutputFormat.text,
) -> None:
    """Verify a live gateway against a policy: requests generated from the policy cover every
    route and feature rule and must reach the pools it names (--min-correct), the pools'
    activation frequencies must fit their weights (chi-square), optionally a locust load
    run (--users) must meet the p99 SLA, and cost/utilisation are read when available.
    OpenAI routes: each model and alias reaches its backends, streams are well-formed SSE
    ending with [DONE] and no unasked usage chunk, plain answers carry usage, an unknown
    model gets a 404; with --users their streaming load run reports TTFT, ITL and tokens/s.
    Exit 0 every bar met, 1 invalid policy, 2 usage (a missing extra, non-loopback load),
    3 gateway unreachable, 4 a bar missed.

    With --admin and more than one Envoy (or --envoy, --all-envoys), each Envoy is checked at
    its own listener against the split its group is served, and the verdict names the Envoys
    that failed (exit 3 when one cannot be reached)."""
    missing = [m for m in _NEEDS if importlib.util.find_spec(m) is None]
    if missing:
        message = (
            f"verify needs the verify extra (pip install 'inferway[verify]'): "
            f"{', '.join(missing)} not installed"
        )
        raise _fail(message, EXIT_CANNOT_START)
    settings = VerifySettings(
        requests=requests,
        concurrency=concurrency,
        min_correct=min_correct,
        alpha=alpha,
        users=users,
        duration_s=_seconds(duration),
        spawn_rate=spawn_rate,
        think_time_s=_seconds(think_time),
        exclude_ramp=exclude_ramp,
        load_cpus=_cpus(load_cpus),
        sla_p99_ms=_seconds(sla_p99) * 1000.0,
        max_error_percent=max_errors,
        prometheus=prometheus,
        admin=admin,
        min_utilization=None if min_utilization is None else min_utilization / 100.0,
        png=png,
        seed=seed,
    )
    if png is not None and users is None:
        raise _fail("--png draws the load run: give --users too", EXIT_CANNOT_START)
    if (envoy is not None or all_envoys) and admin is None:
        raise _fail("--envoy and --all-envoys ask the control plane: give --admin", 2)
    if envoy is not None and all_envoys:
        raise _fail("--envoy checks one Envoy, --all-envoys every one: give one of them", 2)
    if admin is not None:
        statuses, problems = fleet_statuses(admin)
        targets = envoy_targets(statuses)
        connected = sum(t.connected for t in targets)
        if envoy is not None or all_envoys or gateway is None or connected > 1:
            document = verify_fleet(
                file, admin, gateway, targets, problems, envoy, settings, allow_remote
            )
            _finish_fleet(document, json_file, output)
            return
    if gateway is None:
        raise _fail("give --gateway URL, or --admin URL to verify the Envoys it reports", 2)
    if users is not None and not allow_remote and not is_loopback(gateway):
        message = f"{gateway} is not a loopback address: load only with --allow-remote"
        raise _fail(message, EXIT_CANNOT_START)
    weights = _live_weights(admin) if admin else {}
    try:
        policy, routes = load_verify_routes(file, urlsplit(gateway).port, weights)
        openai = openai_targets(policy, urlsplit(gateway).port, weights)
    except (PolicyError, ResolveError) as error:
        issues = error.issues if isinstance(error, PolicyError) else []
        if issues:
            print_issues(make_console(stderr=True), issues)
        else:
            make_console(stderr=True).print(Text(f"{file}: {error}", style="red"))
        raise typer.Exit(EXIT_INVALID) from None
    _reachable(gateway)
    document = asyncio.run(run_verify(str(file), gateway, routes, settings, openai))
    if json_file is not None:
        with json_file.open("w", encoding="utf-8") as stream:
            write_document(document, OutputFormat.json, stream)
    if output is OutputFormat.text:
        render_run(document, Console(soft_wrap=False))
    else:
        write_document(document, output)
    if not document["ok"]:
        raise typer.Exit(EXIT_BAR_MISSED)


def _finish_fleet(document: dict[str, Any], json_file: Path | None, output: OutputFormat) -> None:
    if json_file is not None:
        with json_file.open("w", encoding="utf-8") as stream:
            write_document(document, OutputFormat.json, stream)
    if output is OutputFormat.text:
        render_fleet(document, Console(soft_wrap=False))
    else:
        write_document(document, output)
    if document["unreachable"] or document["problems"]:
        raise typer.Exit(EXIT_UNREACHABLE)
    if not document["ok"]:
        raise typer.Exit(EXIT_BAR_MISSED)
