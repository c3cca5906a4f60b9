"""The ``inferway`` command: validate, render and run a policy; ask a gateway for its status;
run the demo; serve models (the backend's ``serve``, when installed).

Exit codes: 0 ok, 1 the policy was refused (errors printed as ``file:line:column: path:
message``, one per line, on stderr), 2 usage or connection problems.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from inferway.backends.cli import serve
from inferway.gateway.admin import DEFAULT_ADMIN_PORT
from inferway.gateway.certs_cli import app as certs_app
from inferway.gateway.console import configure_logging, make_console, print_issues, short_version
from inferway.gateway.control_plane_process import ControlPlaneSpec
from inferway.gateway.foreground import run_event_loop, serve_gateway
from inferway.gateway.keeper import run_keeper
from inferway.gateway.runtime import (
    DEFAULT_ENVOY_ADMIN_PORT,
    DEFAULT_XDS_PORT,
    GatewayOptions,
    GatewayPlan,
    plan_gateway,
)
from inferway.gateway.xds_mtls import XdsMtlsError, resolve_xds_mtls_files
from inferway.policies import Policy, PolicyError
from inferway.policies.errors import PolicyIssue
from inferway.xds.server import DEFAULT_MAX_CONNECTION_AGE_S

if TYPE_CHECKING:
    from inferway.xds.resources import Resources

__all__ = ["app", "main"]

log = logging.getLogger("inferway")

app = typer.Typer(
    name="inferway",
    help="Sidecar gateway for AI inference: one policy YAML drives a supervised Envoy.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class XdsProtocolChoice(enum.StrEnum):
    sotw = "sotw"
    delta = "delta"


PolicyFile = Annotated[
    Path,
    typer.Option("--file", "-f", help="The policy YAML.", dir_okay=False, show_default=False),
]


def _pem_option(help: str) -> typer.models.OptionInfo:
    """An optional PEM file option of ``run``'s xDS mutual TLS."""
    option: typer.models.OptionInfo = typer.Option(help=help, dir_okay=False)
    return option


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
        raise typer.Exit(1) from None


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


def _envoy_issues(path: Path, policy: Policy, resources: Resources) -> list[PolicyIssue]:
    """``validate --envoy``: Envoy's verdict as issues located on the policy lines it is about
    (none: Envoy accepts it); a missing Envoy binary is exit 2."""
    from inferway.policies.checks_envoy import locate_envoy_message
    from inferway.policies.errors import read_source_text
    from inferway.policies.located import locate_issue, parse_located
    from inferway.xds.envoy_validate import validate_with_envoy

    try:
        verdict = validate_with_envoy(resources)
    except FileNotFoundError as error:
        make_console(stderr=True).print(Text(f"--envoy: {error}", style="red"))
        raise typer.Exit(2) from None
    if verdict.ok:
        return []
    message = f"Envoy refuses this: {verdict.message}"
    document, _ = parse_located(read_source_text(path), str(path))
    locs = locate_envoy_message(policy, verdict.message)
    return [locate_issue(document, str(path), loc, message) for loc in locs] or [
        PolicyIssue(str(path), None, None, "", message)
    ]


@app.command()
def validate(
    files: PolicyFiles, endpoints_file: EndpointsFileOption = None, envoy: EnvoyOption = False
) -> None:
    """Check policies as ``run`` would load them (schema, references, endpoints file,
    certificate files, Envoy consistency; with --envoy also the real Envoy's own check); print
    every located problem of every file. Exit 0 ok, 1 invalid, 2 usage (or no Envoy binary for
    --envoy)."""
    refused = False
    for file in files:
        try:
            plan = plan_gateway(GatewayOptions(policy_path=file, endpoints_file=endpoints_file))
        except PolicyError as error:
            print_issues(make_console(stderr=True), error.issues)
            refused = True
            continue
        if envoy:
            issues = _envoy_issues(file, plan.policy, plan.snapshot.resources)
            if issues:
                print_issues(make_console(stderr=True), issues)
                refused = True
                continue
        _print_summary(file, plan, envoy=envoy)
    if refused:
        raise typer.Exit(1)


def _print_summary(file: Path, plan: GatewayPlan, *, envoy: bool) -> None:
    policy = plan.policy
    summary = Text()
    summary.append("ok ", style="green")
    summary.append(
        f"{file}: {len(policy.listeners)} listener(s), {len(policy.services)} service(s), "
        f"{len(policy.routes)} route(s); snapshot {short_version(plan.snapshot.version)}"
        + ("; envoy --mode validate: ok" if envoy else "")
    )
    make_console().print(summary)
    for route in policy.routes:
        split = " / ".join(f"{b.service} {b.weight:g}%" for b in route.backends)
        make_console().print(Text(f"  route {route.name}: {split}"))


@app.command()
def render(
    file: PolicyFile,
    output: Annotated[
        str, typer.Option("--output", "-o", help="Where to write the YAML; '-' is stdout.")
    ] = "-",
    endpoints_file: EndpointsFileOption = None,
) -> None:
    """Print the Envoy resources a policy translates to (sorted YAML, as pushed over xDS),
    with the endpoints of its endpoints file."""
    from inferway.xds.resources import resources_to_yaml

    text = resources_to_yaml(_plan_or_exit(file, endpoints_file).snapshot.resources)
    if output == "-":
        sys.stdout.write(text)
    else:
        Path(output).write_text(text, encoding="utf-8")
        make_console(stderr=True).print(Text(f"wrote {output}"))


@app.command()
def run(
    file: PolicyFile,
    xds_port: Annotated[int, typer.Option(help="ADS gRPC port.")] = DEFAULT_XDS_PORT,
    admin_port: Annotated[
        int, typer.Option(help="inferway admin API port (/status).")
    ] = DEFAULT_ADMIN_PORT,
    envoy_admin_port: Annotated[
        int, typer.Option(help="Envoy's own admin port.")
    ] = DEFAULT_ENVOY_ADMIN_PORT,
    host: Annotated[str, typer.Option(help="Address the control plane binds.")] = "127.0.0.1",
    admin_address: Annotated[
        str, typer.Option(help="Address the admin API binds (non-loopback is warned about).")
    ] = "127.0.0.1",
    admin_token_file: Annotated[
        Path | None,
        typer.Option(
            help="File holding the admin token for POST /reload (default: "
            "$INFERWAY_ADMIN_TOKEN, else generated into <workdir>/admin-token).",
            dir_okay=False,
        ),
    ] = None,
    node_id: Annotated[str, typer.Option(help="node.id of the supervised Envoy.")] = "inferway",
    node_cluster: Annotated[str, typer.Option(help="node.cluster of the Envoy.")] = "inferway",
    no_envoy: Annotated[
        bool, typer.Option("--no-envoy", help="Run only the control plane (Envoy runs elsewhere).")
    ] = False,
    workdir: Annotated[
        Path | None, typer.Option(help="Where the Envoy bootstrap is written (default: temp).")
    ] = None,
    log_level: Annotated[str, typer.Option(help="inferway log level.")] = "info",
    envoy_log_level: Annotated[str, typer.Option(help="Envoy's --log-level.")] = "warning",
    xds_protocol: Annotated[
        XdsProtocolChoice,
        typer.Option(help="How Envoy speaks ADS: sotw (state of the world) or delta."),
    ] = XdsProtocolChoice.sotw,
    endpoints_file: Annotated[
        Path | None,
        typer.Option(
            help="Services' endpoints from this watched file (overrides the policy's "
            "endpoints_file).",
            dir_okay=False,
        ),
    ] = None,
    otlp_endpoint: Annotated[
        str | None,
        typer.Option(help="OTLP/gRPC collector for the control plane's own spans."),
    ] = None,
    xds_mtls_dir: Annotated[
        Path | None,
        typer.Option(
            help="Mutual TLS between Envoy and the xDS server with the files of `inferway certs "
            "init --dir DIR`: server.pem for the server, ca.pem for both sides, <node-id>.pem "
            "(else client.pem) for Envoy. The options below override single files.",
            file_okay=False,
        ),
    ] = None,
    xds_tls_cert: Annotated[Path | None, _pem_option("The xDS server's certificate (PEM).")] = None,
    xds_tls_key: Annotated[
        Path | None, _pem_option("The xDS server's private key (mode 0600).")
    ] = None,
    xds_client_ca: Annotated[
        Path | None, _pem_option("CA that signs Envoys' client certificates.")
    ] = None,
    xds_envoy_cert: Annotated[
        Path | None, _pem_option("Envoy's client certificate for xDS; must name --node-id.")
    ] = None,
    xds_envoy_key: Annotated[
        Path | None, _pem_option("Envoy's client private key for xDS (mode 0600).")
    ] = None,
    xds_server_ca: Annotated[
        Path | None, _pem_option("CA Envoy trusts for the xDS server (default: client CA).")
    ] = None,
    xds_server_name: Annotated[
        str | None,
        typer.Option(help="SNI Envoy sends to the xDS server; its cert must carry this DNS SAN."),
    ] = None,
    xds_max_connection_age: Annotated[
        float,
        typer.Option(
            help="Seconds after which an Envoy's xDS connection is renewed (0: never), so "
            "rotated xDS certificates reach every connection; Envoy keeps its config meanwhile.",
            min=0,
        ),
    ] = DEFAULT_MAX_CONNECTION_AGE_S,
) -> None:
    """Run the gateway: serve xDS for the policy, watch it for edits, supervise Envoy.

    With Envoy, this process is the keeper (gateway/keeper.py): it owns Envoy and runs the
    control plane as a child process it restarts, so Envoy outlives a control-plane crash."""
    configure_logging(log_level)
    try:
        xds_mtls = resolve_xds_mtls_files(
            directory=xds_mtls_dir,
            node_id=node_id,
            server_certificate=xds_tls_cert,
            server_key=xds_tls_key,
            client_ca=xds_client_ca,
            envoy_certificate=xds_envoy_cert,
            envoy_key=xds_envoy_key,
            server_ca=xds_server_ca,
            server_name=xds_server_name,
        )
    except XdsMtlsError as error:
        make_console(stderr=True).print(Text(str(error), style="red"))
        raise typer.Exit(2) from None
    if otlp_endpoint and no_envoy:  # else the control-plane process sets it up
        from inferway.observability.otel import setup_tracing

        setup_tracing("inferway-control-plane", otlp_endpoint)
    options = GatewayOptions(
        policy_path=file,
        host=host,
        xds_port=xds_port,
        admin_port=admin_port,
        envoy_admin_port=envoy_admin_port,
        node_id=node_id,
        node_cluster=node_cluster,
        with_envoy=not no_envoy,
        workdir=workdir,
        envoy_log_level=envoy_log_level,
        xds_protocol=xds_protocol.value,
        endpoints_file=endpoints_file,
        admin_address=admin_address,
        admin_token_file=admin_token_file,
        xds_mtls=xds_mtls,
        xds_max_connection_age_s=xds_max_connection_age or None,
    )
    if no_envoy:  # nothing to keep alive: the control plane runs in this process
        raise typer.Exit(run_event_loop(serve_gateway(options)))
    spec = ControlPlaneSpec(options, log_level=log_level, otlp_endpoint=otlp_endpoint)
    raise typer.Exit(run_event_loop(run_keeper(spec)))


@app.command()
def status(
    admin: Annotated[
        str, typer.Option(help="The gateway's admin API URL.")
    ] = f"http://127.0.0.1:{DEFAULT_ADMIN_PORT}",
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw JSON.")] = False,
) -> None:
    """Show what a running gateway has live: policy version, refused edits, Envoy ACKs/NACKs."""
    from inferway.gateway.status_client import (
        StatusUnavailableError,
        fetch_status,
        render_status,
    )

    try:
        document = fetch_status(admin)
    except StatusUnavailableError as error:
        make_console(stderr=True).print(Text(str(error), style="red"))
        raise typer.Exit(2) from None
    if as_json:
        sys.stdout.write(json.dumps(document, indent=2, sort_keys=True) + "\n")
    else:
        render_status(document, make_console(soft_wrap=False))


@app.command()
def demo(
    once: Annotated[
        bool, typer.Option("--once", help="Run the scenario once and exit (for CI).")
    ] = False,
    requests: Annotated[
        int, typer.Option("--requests", "-n", min=20, help="Requests per traffic sample.")
    ] = 400,
    trace: Annotated[
        bool, typer.Option("--trace/--no-trace", help="Trace requests; print one trace tree.")
    ] = True,
    mtls: Annotated[
        bool, typer.Option("--mtls", help="Mutual TLS on the listener (development CA).")
    ] = False,
) -> None:
    """Canary demo: two backends, Envoy at 10% canary, then a live edit to 50%."""
    from inferway.devtools.demo import run_demo

    configure_logging("warning")
    raise typer.Exit(run_event_loop(run_demo(once=once, requests=requests, trace=trace, mtls=mtls)))


app.command("serve")(serve)
app.add_typer(certs_app, name="certs")


def main() -> None:
    # The gateway forks Envoy while gRPC threads run; gRPC's fork handlers only matter to a
    # child that keeps using gRPC (Envoy execs at once), and they print a warning on every
    # fork. Set here, in the entry point, not on import: importing inferway changes nothing.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    app()


if __name__ == "__main__":
    main()
