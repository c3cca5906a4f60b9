"""The ``inferway`` command: validate, render and run a policy; ask a gateway for its status;
verify a live gateway against its policy; run the demo; serve models (the backend's
``serve``, when installed), optimize and encrypt them.

Operator conventions (docs/cli.md): ``--version``; ``-o text|json|yaml`` on status, render,
validate and verify; ``--log-format json|text`` on run and serve; shell completion; exit codes
0 ok, 1 invalid or refused (errors as ``file:line:column: path: message``, one per line, on
stderr), 2 usage, 3 the admin API unreachable, 4 a verify bar missed (``gateway/exit_codes.py``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from inferway.cli.certs import app as certs_app
from inferway.cli.conventions import PolicyFile, VersionOption, run_app
from inferway.cli.model import register_model_tools
from inferway.cli.output import (
    DocumentOutputOption,
    OutputFormat,
    OutputOption,
    file_verdict,
    validation_report,
    write_document,
)
from inferway.cli.profile import profile
from inferway.cli.report import app as report_app
from inferway.cli.rollout import app as rollout_app
from inferway.cli.run import run
from inferway.cli.scale import app as scale_app
from inferway.cli.serve import serve
from inferway.cli.validate import check_policy_file, print_summary
from inferway.cli.verify import verify
from inferway.console import configure_logging, make_console, print_issues
from inferway.exit_codes import EXIT_CANNOT_START, EXIT_INVALID, EXIT_UNREACHABLE
from inferway.gateway.admin import DEFAULT_ADMIN_PORT
from inferway.gateway.foreground import run_event_loop
from inferway.gateway.runtime import (
    GatewayOptions,
    GatewayPlan,
    plan_gateway,
)
from inferway.policies import PolicyError

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
    try:
        with out.open("w", encoding="utf-8") as stream:
            write_document(document, fmt, stream)
    except OSError as error:
        reason = error.strerror or str(error)
        make_console(stderr=True).print(Text(f"cannot write {out}: {reason}", style="red"))
        raise typer.Exit(EXIT_CANNOT_START) from None
    make_console(stderr=True).print(Text(f"wrote {out}"))


@app.command()
def status(
    admin: Annotated[
        str, typer.Option(help="The gateway's admin API URL.")
    ] = f"http://127.0.0.1:{DEFAULT_ADMIN_PORT}",
    output: OutputOption = OutputFormat.text,
) -> None:
    """Show what a running gateway has live: policy version, refused edits, Envoy ACKs/NACKs
    (-o json|yaml: the admin API's GET /status document). Exit 3 when it cannot be reached."""
    from inferway.cli.admin_client import StatusUnavailableError, fetch_status, render_status

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
app.command()(run)
app.command("profile")(profile)
app.command("verify")(verify)
app.add_typer(certs_app, name="certs")
app.add_typer(rollout_app, name="rollout")
app.add_typer(scale_app, name="scale")
register_model_tools(app)
app.add_typer(report_app, name="report")


def main() -> None:
    """The CLI itself; the ``inferway`` command enters through ``gateway/entry.py``, which sets
    the process environment first (``python -m inferway.cli.main`` skips that)."""
    run_app(app)


if __name__ == "__main__":
    main()
