"""``inferway validate`` and ``inferway render``: a policy file checked as ``run`` would load
it, and the Envoy resources it translates to. Both plan the gateway (pydantic policies, the
xDS translation), so this module is imported only when one of them runs (``cli/lazy.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from inferway.cli.conventions import PolicyFile
from inferway.cli.output import (
    DocumentOutputOption,
    OutputFormat,
    OutputOption,
    file_verdict,
    validation_report,
    write_document,
)
from inferway.cli.validate import check_policy_file, print_summary
from inferway.console import make_console, print_issues
from inferway.exit_codes import EXIT_CANNOT_START, EXIT_INVALID
from inferway.gateway.gateway_plan import GatewayOptions, GatewayPlan, plan_gateway
from inferway.policies import PolicyError

__all__ = ["render", "validate"]

EndpointsFileOption = Annotated[
    Path | None,
    typer.Option(
        "--endpoints-file",
        help="Services' endpoints from this file (overrides the policy's endpoints_file), "
        "as `run` takes them.",
        dir_okay=False,
        show_default=False,
    ),
]


def _plan_or_exit(path: Path, endpoints_file: Path | None = None) -> GatewayPlan:
    """The gateway ``run`` would start for ``path`` (policy, endpoints file, certificate
    files, translated and checked), without its sockets; every located problem is printed
    and exits 1, exactly as ``run`` refuses to start."""
    try:
        return plan_gateway(GatewayOptions(policy_path=path, endpoints_file=endpoints_file))
    except PolicyError as error:
        print_issues(make_console(stderr=True), error.issues)
        raise typer.Exit(EXIT_INVALID) from None


PolicyFiles = Annotated[
    list[Path],
    typer.Option(
        "--file",
        "-f",
        help="A policy YAML (repeat for several).",
        dir_okay=False,
        show_default=False,
    ),
]


EnvoyOption = Annotated[
    bool,
    typer.Option(
        "--envoy",
        help="Also run the generated configuration through the real Envoy binary "
        "(`envoy --mode validate`); its complaints are mapped back to the policy's lines.",
    ),
]


def validate(
    files: PolicyFiles,
    endpoints_file: EndpointsFileOption = None,
    envoy: EnvoyOption = False,
    output: OutputOption = OutputFormat.text,
) -> None:
    """Check policies as ``run`` would load them (schema, references, endpoints file,
    certificate files, Envoy consistency; with --envoy also the real Envoy's own check); print
    every located problem of every file (-o json: one report with each file's verdict). Exit 0
    ok, 1 invalid, 2 usage (or no Envoy binary for --envoy)."""
    verdicts = []
    for file in files:
        try:
            issues, summary = check_policy_file(file, endpoints_file, envoy=envoy)
        except FileNotFoundError as error:  # --envoy without an Envoy binary
            make_console(stderr=True).print(Text(f"--envoy: {error}", style="red"))
            raise typer.Exit(EXIT_CANNOT_START) from None
        verdicts.append(file_verdict(str(file), issues, summary))
        if output is not OutputFormat.text:
            continue
        if issues:
            print_issues(make_console(stderr=True), issues)
        else:
            print_summary(make_console(), str(file), summary or {})
    report = validation_report(verdicts)
    if output is not OutputFormat.text:
        write_document(report, output)
    if not report["ok"]:
        raise typer.Exit(EXIT_INVALID)


def render(
    file: PolicyFile,
    output: DocumentOutputOption = OutputFormat.yaml,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Write to this file instead of stdout.",
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    endpoints_file: EndpointsFileOption = None,
    zone: Annotated[
        str,
        typer.Option(
            "--zone",
            help="Render what an Envoy in this zone receives (`inferway envoy --zone`): its "
            "own zone's endpoints first, the others as spill tiers.",
            show_default=False,
        ),
    ] = "",
    region: Annotated[
        str,
        typer.Option("--region", help="The Envoy's region (with --zone).", show_default=False),
    ] = "",
) -> None:
    """Print the Envoy resources a policy translates to (sorted, as pushed over xDS), with the
    endpoints of its endpoints file: YAML (-o yaml, the default; text is the same) or JSON.

    With --zone/--region: what an Envoy of that locality receives (per-zone EDS priorities,
    the same rendering the control plane serves that zone's nodes)."""
    from inferway.resolve import resolve_policy
    from inferway.xds.node_groups import NodeScope, build_group_snapshot
    from inferway.xds.resources import resources_to_dict
    from inferway.xds.zones import NodeLocality

    plan = _plan_or_exit(file, endpoints_file)
    snapshot = plan.snapshot
    locality = NodeLocality(region=region, zone=zone)
    if locality:
        group = NodeScope("envoy", locality=locality).key
        ir = resolve_policy(plan.policy, plan.state)
        snapshot = build_group_snapshot(ir, group, default=snapshot) or snapshot
    document = resources_to_dict(snapshot.resources)
    fmt = OutputFormat.json if output is OutputFormat.json else OutputFormat.yaml
    if out is None:
        write_document(document, fmt)
        return
    try:
        with out.open("w", encoding="utf-8") as stream:
            write_document(document, fmt, stream)
    except OSError as error:
        reason = error.strerror or str(error)
        make_console(stderr=True).print(Text(f"cannot write {out}: {reason}", style="red"))
        raise typer.Exit(EXIT_CANNOT_START) from None
    make_console(stderr=True).print(Text(f"wrote {out}"))
