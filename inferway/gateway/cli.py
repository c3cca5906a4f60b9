"""The ``inferway`` command: validate, render and run a policy; ask a gateway for its status;
run the demo; serve models (the backend's ``serve``, when installed).

Operator conventions (docs/cli.md): ``--version``; ``-o text|json|yaml`` on status, render and
validate; ``--log-format json|text`` on run and serve; shell completion; exit codes 0 ok,
1 invalid or refused (errors as ``file:line:column: path: message``, one per line, on stderr),
2 usage, 3 the admin API unreachable (``gateway/exit_codes.py``).
"""

from __future__ import annotations

import enum
import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from inferway.backends.cli import serve
from inferway.gateway.admin import DEFAULT_ADMIN_PORT
from inferway.gateway.certs_cli import app as certs_app
from inferway.gateway.cli_conventions import LogFormatOption, VersionOption, run_app
from inferway.gateway.console import configure_logging, make_console, print_issues
from inferway.gateway.control_plane_process import ControlPlaneSpec
from inferway.gateway.exit_codes import EXIT_CANNOT_START, EXIT_INVALID, EXIT_UNREACHABLE
from inferway.gateway.foreground import run_event_loop, serve_gateway
from inferway.gateway.keeper import run_keeper
from inferway.gateway.output import (
    DocumentOutputOption,
    OutputFormat,
    OutputOption,
    file_verdict,
    validation_report,
    write_document,
)
from inferway.gateway.rollouts.cli import app as rollout_app
from inferway.gateway.runtime import (
    DEFAULT_ENVOY_ADMIN_PORT,
    DEFAULT_XDS_PORT,
    GatewayOptions,
    GatewayPlan,
    plan_gateway,
)
from inferway.gateway.scale_cli import app as scale_app
from inferway.gateway.validation import check_policy_file, print_summary
from inferway.gateway.xds_mtls import XdsMtlsError, resolve_xds_mtls_files
from inferway.policies import PolicyError
from inferway.xds.server import DEFAULT_MAX_CONNECTION_AGE_S

__all__ = ["app", "main"]

log = logging.getLogger("inferway")

app = typer.Typer(
    name="inferway",
    help="Sidecar gateway for AI inference: one policy YAML drives a supervised Envoy.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(version: VersionOption = False) -> None:
    """Sidecar gateway for AI inference: one policy YAML drives a supervised Envoy."""


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


@app.command()
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


@app.command()
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
) -> None:
    """Print the Envoy resources a policy translates to (sorted, as pushed over xDS), with the
    endpoints of its endpoints file: YAML (-o yaml, the default; text is the same) or JSON."""
    from inferway.xds.resources import resources_to_dict

    document = resources_to_dict(_plan_or_exit(file, endpoints_file).snapshot.resources)
    fmt = OutputFormat.json if output is OutputFormat.json else OutputFormat.yaml
    if out is None:
        write_document(document, fmt)
        return
    with out.open("w", encoding="utf-8") as stream:
        write_document(document, fmt, stream)
    make_console(stderr=True).print(Text(f"wrote {out}"))


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
    log_format: LogFormatOption = None,
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
    chosen_log_format = configure_logging(log_level, log_format)
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
        raise typer.Exit(EXIT_CANNOT_START) from None
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
    spec = ControlPlaneSpec(
        options, log_level=log_level, log_format=chosen_log_format, otlp_endpoint=otlp_endpoint
    )
    raise typer.Exit(run_event_loop(run_keeper(spec)))


@app.command()
def status(
    admin: Annotated[
        str, typer.Option(help="The gateway's admin API URL.")
    ] = f"http://127.0.0.1:{DEFAULT_ADMIN_PORT}",
    output: OutputOption = OutputFormat.text,
) -> None:
    """Show what a running gateway has live: policy version, refused edits, Envoy ACKs/NACKs
    (-o json|yaml: the admin API's GET /status document). Exit 3 when it cannot be reached."""
    from inferway.gateway.status_client import (
        StatusUnavailableError,
        fetch_status,
        render_status,
    )

    try:
        document = fetch_status(admin)
    except StatusUnavailableError as error:
        make_console(stderr=True).print(Text(str(error), style="red"))
        raise typer.Exit(EXIT_UNREACHABLE) from None
    if output is OutputFormat.text:
        render_status(document, make_console(soft_wrap=False))
    else:
        write_document(document, output)


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
    rollout: Annotated[
        bool,
        typer.Option(
            "--rollout",
            help="Then a rollout scene: v2 promoted step by step, a bad v3 rolled back.",
        ),
    ] = False,
) -> None:
    """Canary demo: two backends, Envoy at 10% canary, then a live edit to 50%."""
    from inferway.backends.install_check import missing_backend_message, missing_backend_modules
    from inferway.xds.envoy_binary import find_envoy

    missing = missing_backend_modules()
    if missing:  # a gateway-only or core-only install (docs/install.md)
        typer.echo(missing_backend_message("demo", missing), err=True)
        raise typer.Exit(EXIT_CANNOT_START)
    try:
        find_envoy()
    except FileNotFoundError as exc:  # a backend-only or core-only install
        typer.echo(f"inferway demo: {exc}", err=True)
        raise typer.Exit(EXIT_CANNOT_START) from None
    from inferway.devtools.demo import run_demo  # imports the backend: after the checks

    configure_logging("warning")
    raise typer.Exit(
        run_event_loop(
            run_demo(once=once, requests=requests, trace=trace, mtls=mtls, rollout=rollout)
        )
    )


app.command("serve")(serve)
app.add_typer(certs_app, name="certs")
app.add_typer(rollout_app, name="rollout")
app.add_typer(scale_app, name="scale")


def main() -> None:
    """The CLI itself; the ``inferway`` command enters through ``gateway/entry.py``, which sets
    the process environment first (``python -m inferway.gateway.cli`` skips that)."""
    run_app(app)


if __name__ == "__main__":
    main()
