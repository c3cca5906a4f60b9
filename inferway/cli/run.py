"""``inferway run``: the gateway in the foreground (keeper + control plane + Envoy), its many
options in one place so cli.py stays a table of commands."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from inferway.cli.conventions import LogFormatOption, PolicyFile
from inferway.console import configure_logging, make_console
from inferway.exit_codes import EXIT_CANNOT_START
from inferway.gateway.admin import DEFAULT_ADMIN_PORT
from inferway.gateway.control_plane_process import ControlPlaneSpec
from inferway.gateway.foreground import run_event_loop, serve_gateway
from inferway.gateway.gateway_plan import (
    DEFAULT_ENVOY_ADMIN_PORT,
    DEFAULT_XDS_PORT,
    GatewayOptions,
)
from inferway.gateway.keeper import run_keeper
from inferway.gateway.xds_mtls import XdsMtlsError, resolve_xds_mtls_files
from inferway.xds.server import DEFAULT_MAX_CONNECTION_AGE_S

__all__ = ["XdsProtocolChoice", "run"]


class XdsProtocolChoice(enum.StrEnum):
    sotw = "sotw"
    delta = "delta"


def _pem_option(help: str) -> typer.models.OptionInfo:
    """An optional PEM file option of ``run``'s xDS mutual TLS."""
    option: typer.models.OptionInfo = typer.Option(help=help, dir_okay=False)
    return option


def run(
    file: PolicyFile,
    xds_port: Annotated[
        int, typer.Option(help="ADS gRPC port.", min=0, max=65535)
    ] = DEFAULT_XDS_PORT,
    admin_port: Annotated[
        int, typer.Option(help="inferway admin API port (/status).", min=0, max=65535)
    ] = DEFAULT_ADMIN_PORT,
    envoy_admin_port: Annotated[
        int, typer.Option(help="Envoy's own admin port.", min=0, max=65535)
    ] = DEFAULT_ENVOY_ADMIN_PORT,
    host: Annotated[str, typer.Option(help="Address the control plane binds.")] = "127.0.0.1",
    admin_address: Annotated[
        str,
        typer.Option(
            help="Address the admin API binds (non-loopback: warned about, and reads need the "
            "admin token too)."
        ),
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
    zone: Annotated[
        str, typer.Option(help="The supervised Envoy's zone (node.locality.zone).")
    ] = "",
    region: Annotated[
        str, typer.Option(help="The supervised Envoy's region (node.locality.region).")
    ] = "",
    store: Annotated[
        str,
        typer.Option(
            help="The fleet's store: etcd://HOST:PORT,HOST:PORT (one or more), "
            "kubernetes://NAMESPACE (a Lease and ConfigMaps in the API server) or file:PATH. "
            "With one, the rollout and autoscaling loops run on the elected "
            "replica only, from the fleet's shared state and every Envoy's pushed stats "
            "(docs/fleet.md). Default: one node, state in the workdir."
        ),
    ] = "",
    replica_id: Annotated[
        str, typer.Option(help="This replica's name in the election (default: host:xds-port).")
    ] = "",
    lease_ttl: Annotated[
        float,
        typer.Option(help="The leader's lease in seconds: failover happens within it.", min=2),
    ] = 5.0,
    no_envoy: Annotated[
        bool, typer.Option("--no-envoy", help="Run only the control plane (Envoy runs elsewhere).")
    ] = False,
    workdir: Annotated[
        Path | None, typer.Option(help="Where the Envoy bootstrap is written (default: temp).")
    ] = None,
    log_level: Annotated[str, typer.Option(help="inferway log level.")] = "info",
    log_format: LogFormatOption = None,
    envoy_log_level: Annotated[str, typer.Option(help="Envoy's --log-level.")] = "warning",
    envoy_concurrency: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Envoy's worker threads (--concurrency; default: one per core). A picker "
            "scored in Envoy (process: envoy, pick: score) keeps its prefix index per worker: "
            "1 gives the pool one (docs/picker.md).",
        ),
    ] = None,
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
        zone=zone,
        region=region,
        store=store,
        replica_id=replica_id,
        lease_ttl_s=lease_ttl,
        with_envoy=not no_envoy,
        workdir=workdir,
        envoy_log_level=envoy_log_level,
        envoy_concurrency=envoy_concurrency,
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
